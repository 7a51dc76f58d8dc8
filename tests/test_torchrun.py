"""course_lib.torchrun and the script writer: results, rank order, failures, timeouts, no orphans."""

from __future__ import annotations

import importlib.util
import os
import re
import tempfile
import time

import psutil
import pytest
import torch
import torch.distributed as dist

from course_lib.launcher import launch, rank_device
from course_lib.torchrun import TorchrunError, TorchrunTimeout, run_agents, run_torchrun
from course_lib.torchrun_script import function_calls_init_process_group, write_torchrun_script

SCALE = 3
NAMES = ("a", "b")
GLOBAL_TENSOR = torch.ones(2)


def _scaled(x):
    return x * SCALE


def helper_and_constants():
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(f"sum {t.item():.0f}")
    return _scaled(t), NAMES[dist.get_rank() % 2]


def initialises_itself():
    dist.init_process_group("gloo")
    t = torch.ones(1) * dist.get_rank()
    dist.all_reduce(t)
    return t


def uses_a_global_tensor():
    return GLOBAL_TENSOR + dist.get_rank()


def hangs():
    if dist.get_rank() == 0:
        dist.barrier()
    time.sleep(600)


def _descendants_of_this_process():
    """torchrun agents and their workers still running (launch's own warm server may stay)."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if "torch.distributed.run" in cmdline or "torchrun-script-" in cmdline:
            found.append(proc)
    return found


def test_helpers_constants_and_tensors_travel_with_the_function():
    got = run_torchrun(helper_and_constants, 2, timeout=120)
    assert got == launch(helper_and_constants, 2, timeout=60, show_output=False) or all(
        torch.equal(a[0], b[0]) and a[1] == b[1]
        for a, b in zip(got, launch(helper_and_constants, 2, timeout=60, show_output=False)))
    torch.testing.assert_close(got[0][0], torch.tensor([9.0]))
    assert [g[1] for g in got] == ["a", "b"]


def test_rank_ordered_output(capsys):
    run_torchrun(helper_and_constants, 2, timeout=120)
    assert capsys.readouterr().out.splitlines() == ["[rank 0] sum 3", "[rank 1] sum 3"]


def test_a_function_that_initialises_the_group_itself():
    assert function_calls_init_process_group(initialises_itself)
    assert not function_calls_init_process_group(helper_and_constants)
    got = run_torchrun(initialises_itself, 2, timeout=120)
    torch.testing.assert_close(got, [torch.ones(1), torch.ones(1)])


def test_a_global_tensor_is_refused_with_the_fix(tmp_path):
    with pytest.raises(TypeError, match="GLOBAL_TENSOR.*pass it in through args"):
        write_torchrun_script(uses_a_global_tensor, tmp_path / "x.py")


def test_tensor_arguments_go_into_a_side_file(tmp_path):
    script = write_torchrun_script(_scaled, tmp_path / "scaled.py", args=(torch.arange(3.0),))
    assert (tmp_path / "scaled.py.args.pt").exists()
    got = run_agents(script, [["--standalone", "--nproc-per-node=1"]], timeout=120, show_output=False).results
    torch.testing.assert_close(got[0], torch.arange(3.0) * 3)


def test_a_failing_rank_stops_everything(tmp_path, monkeypatch):
    def fails_on_rank_one():
        if dist.get_rank() == 1:
            raise ValueError("rank one is broken")
        dist.barrier()

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the run's own folders go here
    with pytest.raises(TorchrunError, match="agent 0") as failure:
        run_torchrun(fails_on_rank_one, 2, timeout=120, show_output=False)
    assert not _descendants_of_this_process()
    # the report still quotes the agent's log, read before the run's folder was removed
    assert re.search(r"\n\s+rank\s+: 1 \(local_rank: 1\)", str(failure.value)), str(failure.value)
    assert not list(tmp_path.iterdir()), "the run left its folders behind"


def test_a_timeout_stops_every_agent_and_worker():
    start = time.monotonic()
    with pytest.raises(TorchrunTimeout):
        run_torchrun(hangs, 2, timeout=15, show_output=False)
    assert time.monotonic() - start < 60
    assert not _descendants_of_this_process()


def test_the_fixed_port_is_never_used():
    def port():
        return int(os.environ["MASTER_PORT"])

    assert 29500 not in run_torchrun(port, 2, timeout=120, show_output=False)


def test_a_notebook_s_own_open_is_left_to_the_builtin(tmp_path):
    # IPython binds a wrapper of the builtin `open` in every notebook's globals; the script must
    # use the builtin, not try to copy the wrapper's source (it has none there).
    import functools
    import io

    @functools.wraps(io.open)
    def notebook_open(*args, **kwargs):
        return io.open(*args, **kwargs)

    module_path = tmp_path / "notebook_cell.py"
    module_path.write_text("import torch.distributed as dist\n\n\ndef writes_a_file(path):\n"
                           "    with open(path, 'w') as f:\n        f.write(str(dist.get_rank()))\n")
    spec = importlib.util.spec_from_file_location("notebook_cell", module_path)
    cell = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cell)
    cell.open = notebook_open  # what the kernel's globals hold
    script = write_torchrun_script(cell.writes_a_file, tmp_path / "writes.py").read_text()
    assert "def writes_a_file" in script
    assert "def open" not in script and "notebook_open" not in script


def _returns_one():
    return 1


def _load_script(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines the functions; the entry runs only as __main__
    return module


# (GPUs the rank sees, CUDA_VISIBLE_DEVICES, LOCAL_RANK) -> the device the script puts the rank on
GPU_LAYOUTS = {
    "no GPU": (0, None, "1", None),
    "one GPU per rank, each sees only its own as cuda:0": (1, "3", "0", 0),
    "one GPU per rank, torchrun --virtual-local-rank": (1, "1", "0", 0),
    "all four GPUs visible, cuda:LOCAL_RANK": (4, None, "1", 1),
    "all four GPUs visible, CUDA_VISIBLE_DEVICES listing them": (4, "0,1,2,3", "3", 3),
    "one GPU visible to both ranks: not their own": (1, None, "1", None),
}


@pytest.mark.parametrize("layout", GPU_LAYOUTS)
def test_the_script_picks_nccl_and_the_device_in_every_gpu_layout(layout, tmp_path, monkeypatch, capfd):
    visible, cuda_visible, local_rank, expected_gpu = GPU_LAYOUTS[layout]
    module = _load_script(write_torchrun_script(_returns_one, tmp_path / "one.py"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: visible > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    for name, value in {"RANK": local_rank, "LOCAL_RANK": local_rank, "LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "4",
                        "CUDA_VISIBLE_DEVICES": cuda_visible, "COURSE_TORCHRUN_OUTPUT": None}.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert module._gpu_of_this_rank() == expected_gpu
    # the notebooks' rank_device() puts a rank on the same device as the script does
    assert rank_device() == (torch.device("cpu") if expected_gpu is None else torch.device("cuda", expected_gpu))
    devices, backends = [], []
    monkeypatch.setattr(torch.cuda, "set_device", devices.append)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kwargs: backends.append(backend))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)  # nothing to tear down: no group was made
    module._course_entry()
    assert backends == ["gloo" if expected_gpu is None else "cpu:gloo,cuda:nccl"]
    assert devices == ([] if expected_gpu is None else [expected_gpu])
    assert capfd.readouterr().out == f"[rank {local_rank}] returned 1\n"


def _rank_gpu_on_one_gpu_machine():
    """In a rank: rank_gpu() as on a machine with one GPU (CI has none), and rank_device()'s answer."""
    import torch

    from course_lib.launcher import rank_gpu

    torch.cuda.is_available, torch.cuda.device_count = (lambda: True), (lambda: 1)
    return rank_gpu()


@pytest.mark.parametrize("world_size, expected", [(1, [0]), (3, [None] * 3)])
def test_a_session_wide_cuda_visible_devices_keeps_a_launchs_ranks_off_the_shared_gpu(world_size, expected,
                                                                                      monkeypatch):
    """A learner who exported CUDA_VISIBLE_DEVICES=0 has one GPU for the whole session: a one-rank
    launch takes it, the ranks of a bigger launch all stay on the CPU (as choose_backend's gloo
    expects), not every rank on cuda:0 as if each had a GPU of its own."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert launch(_rank_gpu_on_one_gpu_machine, world_size=world_size, init_process_group=False,
                  show_output=False) == expected


@pytest.mark.parametrize("gpus, world_size, backend, expected", [
    (0, 4, "gloo", None),  # a laptop: nothing to say, every rank is on the CPU
    (1, 4, "gloo", "4 ranks on the CPU (gloo): 1 GPU for 4 ranks, so no rank takes one (rank_device() is the CPU)"),
    (1, 1, "cpu:gloo,cuda:nccl", "1 rank on cuda:0: CUDA tensors over NCCL, CPU tensors over gloo"),
    (8, 4, "cpu:gloo,cuda:nccl", "4 ranks each on a GPU of its own (cuda:0 to cuda:3): CUDA tensors over NCCL, "
                                 "CPU tensors over gloo"),
])
def test_a_launch_on_a_gpu_machine_says_where_its_ranks_run(gpus, world_size, backend, expected, monkeypatch):
    from course_lib.launcher import _placement_line

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    assert _placement_line(world_size, backend) == expected


def _hello():
    print("hello")


def test_the_placement_line_heads_a_launchs_output(monkeypatch, capsys):
    """One GPU, four ranks: the output begins with where the ranks ran (choose_backend sees the same GPU)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    launch(_hello, world_size=4)
    assert capsys.readouterr().out.splitlines() == [
        "4 ranks on the CPU (gloo): 1 GPU for 4 ranks, so no rank takes one (rank_device() is the CPU)",
        *[f"[rank {rank}] hello" for rank in range(4)]]
