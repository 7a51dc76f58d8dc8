"""The real chapters' exercises, graded as a class would be.

One grading run (one grade.py, as an instructor grades a class) takes, for every chapter with
an exercise, four kinds of student:
- untouched: the exercise as handed out, which must earn nothing;
- solved: the solution notebook, which must earn full marks;
- tests/submissions/<chapter>/wrong*.ipynb: answers that are wrong in plausible ways
  (the mistakes learners really make), each of which must score 0 on every check;
- tests/submissions/<chapter>/unusual*.ipynb: correct answers reached another way
  (another algorithm, API or naming), which must earn full marks;
- generated: answers that only raise (errors the kernel cannot even report among them) or do
  nothing, which must earn nothing.
"""

import csv
import json
import random
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXERCISES = sorted((REPO / "exercises").glob("*.ipynb"))
SUBMISSIONS = Path(__file__).resolve().parent / "submissions"


def points_possible(solution: Path) -> int:
    cells = json.loads(solution.read_text())["cells"]
    return sum(int(c["metadata"].get("nbgrader", {}).get("points", 0)) for c in cells
               if c["metadata"].get("nbgrader", {}).get("grade"))


def answer_cells(notebook: Path) -> list[str]:
    cells = json.loads(notebook.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["metadata"].get("nbgrader", {}).get("solution")]


def test_every_chapter_has_wrong_and_unusual_submissions():
    for exercise in EXERCISES:
        folder = SUBMISSIONS / exercise.stem
        assert list(folder.glob("wrong*.ipynb")), f"no wrong-but-plausible submission for {exercise.stem}"
        assert list(folder.glob("unusual*.ipynb")), f"no unusual correct submission for {exercise.stem}"


def test_every_test_submissions_answers_compile():
    """A wrong submission must fail for the mistake its name states. One whose answer cell does not even compile
    (six of chapter 06's did, from a bad edit) fails every check of that cell by a SyntaxError, and so proves
    nothing about the check it was written against."""
    broken = []
    for path in sorted(SUBMISSIONS.glob("*/*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            grading = cell["metadata"].get("nbgrader", {})
            if grading.get("solution") and cell["cell_type"] == "code":
                try:
                    compile("".join(cell["source"]), f"{path.name}:{grading.get('grade_id')}", "exec")
                except SyntaxError as error:
                    broken.append(f"{path.relative_to(SUBMISSIONS)} {grading.get('grade_id')}: {error}")
    assert not broken, "\n".join(broken)


# Answers that only raise, or do nothing, in place of each stub's `raise NotImplementedError(...)`: none may
# earn a point. Several are errors the judge's kernel cannot send to nbval (a message that is not UTF-8, an
# exception whose __str__ raises), which nbval took for passes until a pass had to be proven by the judge's
# record (course_lib.grading.proof). The first stub of every chapter gets the first; the rest are drawn.
STUB = 'raise NotImplementedError("Your code here")'
ONLY_RAISES = [
    'raise ValueError("\\ud800")',
    'raise type("Unreadable", (Exception,), {"__str__": lambda self: str(1 / 0)})()',
    'raise KeyError("\\udcff" * 3)',
    'raise SystemExit(0)',
    'raise KeyboardInterrupt',
    'raise BaseException("\\ud800" + "x" * 100_000)',
    'import os; os._exit(0)',
    'return None',
    'pass',
]


def only_raises(exercise: Path) -> str:
    """The exercise with every stub replaced by one of ONLY_RAISES, drawn with the chapter's name as seed."""
    draw = random.Random(exercise.stem)
    notebook = json.loads(exercise.read_text())
    replaced = 0
    for cell in notebook["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("solution"):
            lines = "".join(cell["source"]).split("\n")
            for number, line in enumerate(lines):
                if line.strip() == STUB:
                    body = ONLY_RAISES[0] if replaced == 0 else draw.choice(ONLY_RAISES)
                    lines[number] = line[:len(line) - len(line.lstrip())] + body
                    replaced += 1
            cell["source"] = "\n".join(lines)
    assert replaced, f"no stub found in {exercise.name}"
    return json.dumps(notebook)


def students_of(exercise: Path) -> dict[str, Path | str]:
    """The class for one chapter: untouched, solved, every submission in tests/submissions/, and one whose
    answers only raise (a notebook's text, made here)."""
    solution = REPO / "solutions" / exercise.name
    students = {"untouched": exercise, "solved": solution, "wrong_generated_only_raises": only_raises(exercise)}
    for submission in sorted((SUBMISSIONS / exercise.stem).glob("*.ipynb")):
        assert answer_cells(submission) != answer_cells(solution), f"{submission.name} is the solution itself"
        students[submission.stem] = submission
    return students


@pytest.fixture(scope="module")
def graded_class(request, tmp_path_factory):
    """One grading run for every chapter selected in this session (one grade.py, its jobs kept busy
    across chapters); student folders are named <chapter>--<student> and hold that one notebook.
    Each chapter's class goes to one judge (--max-batch: the largest class): a second judge for a
    chapter would only run its kernel start-up and setup cells again (the split itself is tested
    in test_grading.py)."""
    selected = sorted({item.callspec.params["exercise"] for item in request.session.items
                       if getattr(item, "originalname", "") == "test_grading_rewards_right_answers_and_only_them"})
    root = tmp_path_factory.mktemp("grading")
    handed_out, folder = root / "handed_out", root / "class"
    handed_out.mkdir()
    for exercise in selected:
        shutil.copy(exercise, handed_out / exercise.name)
        for student, source in students_of(exercise).items():
            (folder / f"{exercise.stem}--{student}").mkdir(parents=True)
            if isinstance(source, str):
                (folder / f"{exercise.stem}--{student}" / exercise.name).write_text(source)
            else:
                shutil.copy(source, folder / f"{exercise.stem}--{student}" / exercise.name)
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "grade.py"), str(folder),
                          "--exercises", str(handed_out), "--jobs", "2",
                          "--max-batch", str(max(len(students_of(exercise)) for exercise in selected))],
                         capture_output=True, text=True, timeout=3000, cwd=REPO)
    print(run.stdout[-20000:])
    assert run.returncode == 0, run.stdout + run.stderr
    with open(folder / "grades.csv", newline="") as f:
        return folder, list(csv.DictReader(f))


# Hostile submissions must fail for the reason they were written to meet, not by accident (say, a
# barrier that the check's log of operations happens to refuse): the measurement that stops each route.
STOPPED_BY = {
    ("01_collectives", "wrong_measurement_routes"): [
        "MeasurementRefused: the ranks wrote",  # the built-in all-reduce, hidden, its bytes shaped with /dev/null
        # gathered through /dev/shm: each rank is kept apart (course_lib.confine.apart), it cannot write there
        "PermissionError: [Errno 13] Permission denied: '/dev/shm/gather",
        "rank 0 raised ResultTooLarge",  # a 512 MiB result, after a fork bomb
    ],
    # Built-in collectives hidden from the rank's log of operations: the bytes per pair of ranks, read from
    # outside, are the ring's, not the asked-for scheme's.
    ("01_collectives", "wrong_hidden_builtins"): [
        "tensors, the naive scheme sends 1.00",  # the ring all-reduce: 1.5 tensors to one neighbour, none to others
        "the bytes between the ranks: rank 0 sent rank 1 3.0",  # the ring all-gather: 3 tensors to one neighbour
    ],
    # The sum, the list and the mean exchanged beside the process group: through a file in /dev/shm, a file in
    # /tmp, an abstract Unix socket. Each rank writes only to a folder of its own and reaches no other rank's
    # socket (course_lib.confine.apart). Without the sandbox, the mean through the socket scores.
    ("01_collectives", "wrong_files_between_ranks"): [
        "raised RuntimeError: [enforce fail at inline_container.cc:746] . open file failed with strerror: Permission",
        "raised PermissionError: [Errno 13] Permission denied: '/tmp/gather",
        "raised PermissionError: [Errno 1] Operation not permitted",
    ],
    # Rules judged on data the checks compare with their own inputs (not on a rank's word about itself).
    ("01_collectives", "wrong_forgotten_return_and_replaced_parameters"): [
        "rank 0's return value: is None, not a tensor",  # summed in place, returned nothing
        "rank 0's element 0 vs rank 0's input",  # one buffer appended four times
        "the parameter object the model had before your function",  # the right mean, in new Parameters
    ],
    # A built-in all-reduce on a thread, with the in-rank audit patched to see nothing: the bytes per pair of
    # ranks, read from outside, are gloo's ring all-reduce (1.5 tensors to one neighbour), not the asked-for ring.
    # Exercise 3: one all-reduce per tensor on a thread, zeros of the rule's buffers in sight of the audit.
    ("05_ring_allreduce", "wrong_tamper_thread_builtin__patched_audit__blocking_step"): [
        "sizes [30000, 2000, 45000, 1001]: the bytes between the ranks: rank 0 sent rank 3 1.5",
        "order [2, 0, 3, 1]: the bytes between the ranks: rank 0 sent rank 3 1.5",
        "64 tensors of mixed dtypes, threshold 1024 B: the bytes between the ranks: rank 0 sent rank 1",
    ],
    # Buffers one tensor short of the threshold (one buffer too many) summing on a thread the in-rank audit does
    # not watch, zeros of the rule's buffers in its sight: the bytes per pair of ranks, read from outside, are
    # more than the rule's buffers send.
    ("05_ring_allreduce", "wrong_tamper_one_buffer_too_many__hidden_from_the_count"): [
        "64 tensors of mixed dtypes, threshold 1024 B: the bytes between the ranks: rank 0 sent rank 1",
    ],
    # Exercise 3's plausible mistakes, each stopped on the first case by the buffers it returns (which the
    # audit's bytes of every all-reduce and, on the second case, the bytes from outside also hold it to).
    ("05_ring_allreduce", "wrong_schedules"): [  # no look-ahead: a buffer closes at the first other dtype
        "threshold 1000 B: rank 0's buffers (positions in tensors): got [[0], [1], [2], [3], [4]",
    ],
    ("05_ring_allreduce", "wrong_builtin_routes"): [  # one open buffer per dtype: no limit to the look-ahead
        "threshold 1000 B: rank 0's buffers (positions in tensors): got [[0, 2, 4], [6], [1, 5, 8]",
    ],
    ("05_ring_allreduce", "wrong_even_pieces__average_unsplit"): [  # the bytes passed over never counted
        "threshold 1000 B: rank 0's buffers (positions in tensors): got [[0, 2, 4], [1, 5, 8], [3, 7]",
    ],
    ("05_ring_allreduce", "wrong_rank_order_ring__predivide_twice"): [  # closed one tensor too late
        "threshold 1000 B: rank 0's buffers (positions in tensors): got [[0, 2, 4], [1, 5], [3, 7]",
    ],
    ("05_ring_allreduce", "wrong_not_a_ring"): [  # buffers that mix dtypes (torch.cat promotes them)
        "threshold 1000 B: rank 0's buffers (positions in tensors): got [[0, 1, 2, 3], [4, 5]",
    ],
    ("05_ring_allreduce", "wrong_cast_copy_lost"): [  # every buffer float32, the sums left in it
        "threshold 1000 B: rank 0, tensor 1 (float16): expected dtype torch.float16, got torch.float32",
    ],
    # The whole weight kept privately, sending what a row-parallel layer sends: each rank is handed true weights
    # only in its own columns, so the output computed alone is wrong.
    ("09_model_pipeline_tensor_parallel", "wrong_private_whole_weight__sends_like_row_parallel"): [
        "rank 1 of 2, 12 -> 8 features: output",
    ],
    # HSDP's gradient path with the right numbers but the whole gradient crossing between nodes (all-reduced over
    # every rank, or all-gathered, or all-reduced out of the audit's sight): the bytes counted from outside stop it.
    ("08_zero_fsdp", "wrong3"): ["sent to other nodes:", "the all-reduce of one shard needs"],
    ("08_zero_fsdp", "wrong_gathers_whole_gradients"): ["sent to other nodes:", "the all-reduce of one shard needs"],
    ("08_zero_fsdp", "wrong_tamper_full_adam_state__blind_audit__frames"): [
        "sent to other nodes:", "the all-reduce of one shard needs",
    ],
    # Every token gathered to every rank, each rank computing its own experts' share: right numbers, but it
    # moves every token to every rank, far beyond what the (token, choice) pairs leaving their rank need.
    ("12_mixture_of_experts", "wrong1_gathers_every_token__drops_by_position__averages_experts_over_dp"): [
        "the bytes 2 ranks sent: were",
    ],
    # Machines of different sizes under the lesson's c10d rendezvous, at the head's address: one world that
    # would run, but c10d numbers the machines itself (address, then process id), so rank 0 lands on the machine
    # whose agent starts first, not on the head (chapter 04's lesson runs such a job). Refused from what torchrun
    # would start the agents with, before any agent runs.
    ("04_launching_multinode", "wrong_even_split_plain_checkpoint_c10d"): [
        "the rendezvous: c10d numbers the machines itself",
    ],
    # The static rendezvous with --node-rank = the machine's place in the list: rank 0 on the list's first machine.
    ("04_launching_multinode", "wrong_first_count_rank0_rng_list_order_node_rank"): ["the head's node rank: got 1"],
    # A script of its own among the options (--no-python python forged.py), reporting what the check wants:
    # torchrun's parser takes it for the script, refused before anything runs.
    ("04_launching_multinode", "wrong_tamper_frames__no_snapshot__script_in_options"): [
        "its options: contain a script name or its arguments",
    ],
    # The check runs these options on the grading machine: one that writes there (torchrun's log folder) is
    # refused before torchrun's code sees it, and so is a worker count other than the machine's, before any starts.
    ("04_launching_multinode", "wrong_tamper_log_dir_on_the_grader"): [
        "its options: set --log-dir, which has no part in forming the job",
    ],
    ("04_launching_multinode", "wrong_tamper_many_workers_where_run"): ["(2 workers): its workers: got 64"],
    # Right answers that first empty the check's own lists on the learner side, through the stack: every task
    # after the first, and every case that the check cannot run on this machine. The check counts the cases it
    # compared against its own number of them, fixed in the judge.
    ("04_launching_multinode", "wrong_tamper_emptied_tasks_and_machines"): [
        "2 nodes x 2 tasks: your function's answers: the check compared 0 of 4 tasks: results came back for 1 of them",
        "mixed_machine_commands' answers: the check compared 0 of 6 cases: results came back for 1 of them",
    ],
    # The textbook one-pass variance, E[x^2] - E[x]^2 in float64: right without an offset, every digit lost with one.
    ("03_ddp", "wrong_fresh_optimizer__textbook_variance"): ["offset 1e+08, rank 0: global standard deviation"],
    # A run stopped mid-epoch on 2 ranks, resumed on 4 by starting the stopped epoch over (as the lesson's resume
    # does at an epoch boundary): the samples the stopped job had used are trained on twice.
    ("03_ddp", "wrong_restarts_the_epoch"): [
        "2 -> 4 ranks, stopped after 96 samples of epoch 1: final weights: they match a run that starts the stopped "
        "epoch over",
    ],
    # Every rank trains alone on whole global batches (the right weights, no all-reduce) and pads the bytes it
    # writes with files: the bytes it sent the other ranks, counted from outside, are far too few.
    ("03_ddp", "wrong_tamper_alone_padded_writes__local_hooks"): [
        "2 -> 4 ranks, stopped after 96 samples of epoch 1: the bytes rank 0 sent",
    ],
    # Every rank computes the stopped job's whole global batches through DDP: the right weights, the right bytes
    # (DDP all-reduces gradients every rank already has), but M times the forward passes each rank's share asks.
    ("03_ddp", "wrong_every_rank_whole_global_batch"): [
        "2 -> 4 ranks, stopped after 96 samples of epoch 1: the samples rank 0 ran forward: were 4.00 times its share",
    ],
    # The right hooks, returned in handles whose remove() empties the check's list of the gradients after each
    # pass, in the frame of the check's function on the learner side: the check counts the passes it compared.
    ("03_ddp", "wrong_tamper_emptied_passes"): [
        "rank 0: the gradients sent back: the check compared 0 of 1 pass: results came back for 0 of them",
    ],
    # Shares in proportion to the speeds, rounded by largest remainder: not the fastest split; every failure in an
    # ExceptionGroup, but in the order the threads finished.
    ("02_data_parallel", "wrong_largest_remainder_and_finishing_order"): [
        "split_by_speed(3, [4, 1, 1], [3, 3, 3]): [2, 1, 0] takes 1 s (device 1 finishes last)",
        "replicas [2, 3] failing, finishing in the order [3, 1, 2, 0]: the replicas whose exceptions the group holds",
    ],
    # chunk's equal shares, whatever the speeds.
    ("02_data_parallel", "wrong_chunk_and_flat_only"): ["those are chunk's equal shares, whatever the speeds"],
    # Right answers that first empty the check's own data on the learner side, through the stack: the list of
    # cases in the frame of the check's function, and the gathered parts it sends back (from a patched loss).
    # Each check counts what it compared against its own number of cases, fixed in the judge.
    ("02_data_parallel", "wrong_tamper_emptied_cases__parts_cleared__first_failure_only__equal_weights"): [
        "split_by_speed's results: the check compared 0 of 8 cases: results came back for 1 of them",
        "the gathered outputs sent back: the check compared 0 of 3 parts: results came back for 0 of them",
    ],
    # Gradient clipping with accumulation: clip_grad_norm_ after every micro-batch's backward, as in a single-GPU
    # loop. Under no_sync, .grad then holds one rank's partial sum, which is clipped: the step itself is wrong,
    # not only the norm it reports (the count of all-reduces is right: one per step).
    ("07_accumulation_large_batch", "wrong2_clip_partial_sums_no_world_size_own_sample_count"): [
        "2 ranks, K=4, sgd, max_norm 0.15 (clipping acts in 3 of 3 steps): rank 0's weights after step 0 vs one process",
    ],
    # An all-reduce after every micro-batch, the hook's count forged from the caller's frame, clipped once: right
    # numbers, stopped by the bytes each rank sent, counted from outside the ranks.
    ("07_accumulation_large_batch", "wrong_tamper_frames_forged_count_hardcoded_785"): [
        "the bytes rank 0 sent (2 ranks, K=4, sgd, max_norm 0.15 (clipping acts in 3 of 3 steps))",
    ],
    # The right epoch, which at its end empties the check's list of the weights after each step, in the frame of
    # the check's function on the learner side: the check counts the steps it compared.
    ("07_accumulation_large_batch", "wrong_tamper_emptied_snapshots"): [
        "2 ranks, k=4, windows of [64, 64, 41] samples: rank 0's weights sent back: the check compared 0 of 3 steps",
    ],
    ("08_zero_fsdp", "wrong_helper_holds_memory"): [
        "a rank's peak memory: grew by",  # sharded in the rank, 4x the parameters held by a forked helper
        # exercise 2: scales by max_norm / norm even where the norm is below max_norm (the case with no clipping)
        "max_norm 1.5x the norm, slices of [1696, 1187, 509] elements: rank 0's clipped shard vs one process",
    ],
    # An all-reduce where a reduce-scatter belongs cannot be told apart from outside with gloo (the same bytes,
    # the same memory): this one is stopped because it holds every full gradient at once.
    ("08_zero_fsdp", "wrong1"): ["a rank's peak memory: grew by"],
    # Every rank's whole gradient gathered in the hook: right numbers, but world_size full gradients at once.
    ("08_zero_fsdp", "wrong_gathers_whole_gradients"): ["a rank's peak memory: grew by"],
    # Clipping, a ZeRO-2 layout with the biases on every rank: an all-reduce of each rank's sum of squares over
    # all it holds counts the biases once per rank (the norm is wrong); a checkpoint laid out per parameter,
    # exercise 1's way, instead of as one flat buffer padded once (rank 0's slice has the wrong size).
    ("08_zero_fsdp", "wrong_clip_counts_replicated_per_rank"): [
        "3 ranks, 3466 parameters, max_norm 0.4x the norm, slices of [1696, 1187, 509] elements: the norm returned "
        "on rank 0 vs one process's clip_grad_norm_",
        "385 parameters saved on 4 ranks (2 empty shards), loaded on 3: rank 0's flat slice vs one process's "
        "parameters: expected shape (129,), got (130,)",
    ],
    # Every rank's shard gathered to take the norm of the whole gradient: the right numbers, stopped by the bytes
    # each rank sent, counted from outside the ranks.
    ("08_zero_fsdp", "wrong3"): ["the bytes rank 0 sent (3 ranks)"],
    # Each rank clips what it holds by its own norm, as in one process: the norm is not the whole gradient's.
    ("08_zero_fsdp", "wrong2"): ["the norm returned on rank 0 vs one process's clip_grad_norm_"],
    # Chapter 11, exercise 1. Activations left out: the fastest layout of all, whose rank keeps all 8 of its
    # sequences' activations at once, measured over the budget.
    ("11_putting_it_together", "wrong5_model_states_only"): [
        "(2, 1, 2, 1), measured on 4 ranks: its fullest rank (stage 0) peaks at 971776 bytes: model states 68608 + "
        "activations 903168, over the budget of 873000",
    ],
    # m = pp, or every micro-batch in flight at every stage (GPipe's count): (2, 2, 1, 4) is ruled out (its
    # shape with 2 micro-batches is over the budget; GPipe counts all 4), so both fall back to a slower layout,
    # and the measured (2, 2, 1, 4) fits.
    ("11_putting_it_together", "wrong3_m_equals_pp_dist_nn_all_reduce_norm_over_all_ranks"): [
        "(2, 2, 1, 4), measured on 4 ranks: fits (472320 bytes at its fullest rank) and the cost model gives it "
        "0.0212 ms a step, against 0.0236 ms for yours, (4, 1, 1, 1)",
        # exercise 3: every rank's squares all-reduced over the world
        "(dp_replicate, dp_shard, pp, tp) = (2, 1, 1, 2), rank 0 at (0, 0, 0, 0): the norm vs one process's",
        "your answer matches everything summed over all ranks, every copy counted",
    ],
    ("11_putting_it_together", "wrong6_gpipe_in_flight"): [
        "(2, 2, 1, 4), measured on 4 ranks: fits (472320 bytes at its fullest rank) and the cost model gives it "
        "0.0212 ms a step, against 0.0236 ms for yours, (4, 1, 1, 1)",
    ],
    # Always the most micro-batches: the bubble is smallest, but FSDP gathers every block once a micro-batch.
    ("11_putting_it_together", "wrong4_largest_m_gathered_logits"): [
        "(2, 2, 1, 4), measured on 4 ranks: fits (472320 bytes at its fullest rank) and the cost model gives it "
        "0.0212 ms a step, against 0.0213 ms for yours, (1, 2, 2, 32)",
    ],
    # Right in the visible case; each is stopped by the hidden case drawn, whatever the grading run's secret, to
    # make that mistake return a layout over the budget: the head left out of the only stage (pp = 1), the
    # norms divided by tp.
    ("11_putting_it_together", "wrong1_no_head_local_log_softmax_norm_over_tp"): [
        "FAILED hidden case 1 of 11 (the head decides)", "), over the budget",
        # exercise 3: every square summed over tp, the pieces whole on tp among them
        "your answer matches everything summed over tp: the pieces whole on every tp rank (the norms', for one) "
        "counted tp times",
    ],
    ("11_putting_it_together", "wrong2_norms_over_tp_detached_sum_norm_of_one_stage"): [
        "FAILED hidden case 2 of 11 (the replicated norms decide)", "), over the budget",
        # exercise 3: no all-reduce over pp
        "(dp_replicate, dp_shard, pp, tp) = (1, 2, 2, 1), rank 0 at (0, 0, 0, 0)",
        "your answer matches one stage's norm: pp left out",
    ],
    # Right in the visible case, and each over-counts: the model states not divided by dp, the embeddings whole
    # on every tp rank. Stopped by a hidden case (the one drawn for that mistake, or an earlier one) where a
    # faster layout fits.
    ("11_putting_it_together", "wrong7_states_whole_on_dp_dist_nn_all_reduce"): [
        "FAILED hidden case", "fits, but the cost model gives it",
    ],
    ("11_putting_it_together", "wrong8_embeddings_whole_gathered_logits"): [
        "FAILED hidden case", "fits, but the cost model gives it",
    ],
    # The classic slips of a DiLoCo outer step, quantised or not, each named by the check: the parameters
    # averaged (no outer optimizer), through the int8 codes or in float64 (which the byte count would stop too);
    # a sign error, in the pseudo-gradient or in the step; the replicas not restarted from the new outer copy, or
    # restarted from the old one.
    ("14_fault_tolerance", "wrong_averages_the_parameters"): [
        "your answer matches one that sets the outer parameters to the mean of the replicas' parameters (as the "
        "codes carry them): that is averaging the parameters, with no outer optimizer",
    ],
    ("14_fault_tolerance", "wrong_averages_the_parameters_in_float64"): [
        "your answer matches one that sets the outer parameters to the mean of the replicas' parameters: that is "
        "averaging the parameters, with no outer optimizer",
    ],
    ("14_fault_tolerance", "wrong_pseudo_gradient_new_minus_old"): [
        "your answer matches one that moves the outer parameters the wrong way: a sign error",
    ],
    ("14_fault_tolerance", "wrong_steps_along_the_pseudo_gradient"): [
        "your answer matches one that moves the outer parameters the wrong way: a sign error",
    ],
    ("14_fault_tolerance", "wrong_replicas_not_restarted"): [
        "your answer matches one that leaves every replica where its inner steps took it: the global copy is not "
        "refreshed",
    ],
    ("14_fault_tolerance", "wrong_replicas_restart_from_the_old_outer"): [
        "your answer matches one that restarts every replica from the outer parameters of before the step (the old "
        "anchor)",
    ],
}


# The first test's setup grades the whole class (every chapter's students, one grade.py run):
# minutes, not the 600 s pytest-timeout gives any single test. grade.py has its own limits.
@pytest.mark.timeout(3000)
@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda path: path.stem)
def test_grading_rewards_right_answers_and_only_them(exercise, graded_class):
    folder, rows = graded_class
    name, solution = exercise.stem, REPO / "solutions" / exercise.name
    possible = points_possible(solution)
    assert possible > 0, f"{name} has no graded checks"
    students = students_of(exercise)
    scores = {row["student"].split("--", 1)[1]: float(row[name]) for row in rows
              if row["student"].startswith(f"{name}--")}
    assert sorted(scores) == sorted(students)

    def feedback(student: str) -> str:  # this chapter's part of the student's feedback
        text = (folder / f"{name}--{student}" / "feedback.txt").read_text()
        section = text[text.index(f"\n{exercise.name}:"):]
        following = re.search(r"\n\S+\.ipynb: ", section[1:])
        return section[:following.start() + 1] if following else section

    for student, score in scores.items():
        if student == "untouched" or student.startswith("wrong"):
            assert score == 0, f"{student} earned {score} of {possible} in {name}:\n{feedback(student)}"
        else:
            assert score == possible, f"{student} earned {score} of {possible} in {name}:\n{feedback(student)}"
    assert "not implemented yet" in feedback("untouched")
    if name == "04_launching_multinode":  # refused before torchrun's code made it, in the judge
        assert not Path("/tmp/course-04-learner-chose-this-log-dir").exists()
    for (chapter, student), reasons in STOPPED_BY.items():
        if chapter == name:
            for reason in reasons:
                assert reason in feedback(student), f"{student} was not stopped by '{reason}':\n{feedback(student)}"


# Chapter 11, exercise 1: its hidden cases are drawn from the grading run's secret, each until its budget makes
# a plausible mistake return a wrong layout. Whatever the secret, every mistake must be caught: a test per draw.
CH11_DRAWS, CH11_DRAWS_RIGHT = 200, 20


def chapter11_hidden_judge(monkeypatch) -> dict:
    """Exercise 1's setup, check helpers and hidden-case definitions from the solution, run in this process
    (no ranks: the hidden cases are judged by the count), with the cost model memoized."""
    from course_lib import capstone

    monkeypatch.setenv("COURSE_LEARNER_SIDE", "1")  # the setup's Learner, inert as in a worker
    cells = {c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"])
             for c in json.loads((REPO / "solutions" / "11_putting_it_together.ipynb").read_text())["cells"]}
    namespace: dict = {}
    exec(cells["setup"], namespace)
    seconds: dict = {}

    def step_time_model(config, *layout_and_batch, **cluster):
        key = (config, layout_and_batch, tuple(sorted(cluster.items())))
        if key not in seconds:
            seconds[key] = capstone.step_time_model(config, *layout_and_batch, **cluster)
        return seconds[key]

    namespace["step_time_model"] = step_time_model
    exec(cells["ex1-check-helpers"], namespace)
    hidden = cells["ex1-check"].split("### BEGIN HIDDEN TESTS\n")[1]
    exec(textwrap.dedent(hidden.split('rng = random.Random(hidden_seed("11 ex1 cases"))')[0]), namespace)
    return namespace


def chapter11_choose_layout(judge: dict, notebook: Path):
    """The notebook's choose_layout, defined beside the setup (as a worker runs it)."""
    namespace = dict(judge)
    for cell in json.loads(notebook.read_text())["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == "ex1-choose-layout":
            exec("".join(cell["source"]), namespace)
    return namespace["choose_layout"]


def chapter11_verdict(judge: dict, case, budget: int, layout) -> str:
    """The hidden check's verdict on one case, as its expects give it: 'right' or why not."""
    if not isinstance(layout, tuple | list) or tuple(layout) not in set(case.layouts):
        return f"not a valid layout: {layout!r}"
    layout = tuple(layout)
    peak = max(map(sum, judge["judge_stage_peaks"](case.config, layout, case.batch_size)))
    if peak > budget:
        return "over the budget"
    best = min(case.fastest(budget))
    return "right" if case.seconds[layout] <= case.seconds[best] * (1 + 1e-9) else "slower than one that fits"


@pytest.mark.timeout(600)
def test_chapter11_exercise1_hidden_cases_catch_every_plausible_mistake_on_every_draw(monkeypatch):
    """Over many draws of the hidden cases (as many grading secrets), every wrong submission of exercise 1 and
    every mistake the judge reproduces returns a wrong layout on at least one case, and the solution and the
    unusual correct submissions are right on every case (of the first draws). Before the hidden cases drawn for
    them, two plausible mistakes (model states not divided by dp: wrong7; the embeddings left whole under tp:
    wrong8) passed every hidden case on 15 and 45 of these 200 draws."""
    judge = chapter11_hidden_judge(monkeypatch)
    folder = SUBMISSIONS / "11_putting_it_together"
    right = {"solution": REPO / "solutions" / "11_putting_it_together.ipynb",
             **{path.stem: path for path in sorted(folder.glob("unusual*.ipynb"))}}
    wrong = {path.stem: path for path in sorted(folder.glob("wrong*.ipynb")) if "tamper" not in path.stem}
    answers = {name: chapter11_choose_layout(judge, path) for name, path in {**right, **wrong}.items()}
    mistakes = [name for name in judge["MISTAKES"] if name]
    escaped: dict = {}
    for draw in range(CH11_DRAWS):
        rng = random.Random(f"11 ex1 cases, draw {draw}")
        cases = [judge["draw_case"](rng, *family) for family in judge["FAMILIES"]]
        for name, choose in answers.items():
            if name in right and draw >= CH11_DRAWS_RIGHT:  # one correct submission builds a model per layout: slow
                continue
            verdicts = []
            for _, case, budget in cases:
                try:
                    layout = choose(case.config, case.world_size, case.batch_size, budget, case.cluster)
                except Exception as error:  # a wrong count may find nothing that fits
                    layout = error
                verdicts.append(chapter11_verdict(judge, case, budget, layout))
            if name in right and verdicts != ["right"] * len(cases):
                escaped.setdefault(name, []).append((draw, verdicts))
            if name in wrong and verdicts == ["right"] * len(cases):
                escaped.setdefault(name, []).append(draw)
        for mistake in mistakes:  # escaped: on every case, one of the layouts its count makes fastest is right
            for _, case, _ in cases:
                case.peak.setdefault(mistake, {layout: max(map(sum, judge["judge_stage_peaks"](
                    case.config, layout, case.batch_size, **judge["MISTAKES"][mistake][0]))) for layout in case.layouts})
            if all(case.fastest(budget, mistake) & case.fastest(budget) for _, case, budget in cases):
                escaped.setdefault(mistake, []).append(draw)
    assert not escaped, escaped
