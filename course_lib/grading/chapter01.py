"""Chapter 01's checks: which communication operations a rank ran, and the bytes between every two ranks.

Introduced with chapter 01's exercises (collectives built from send/recv and from broadcast), whose setup
cell imports these names. ``backend_operations`` (with ``CommunicationLog``) runs inside a check's ranks:
the check's worker function refers to it, and the rank imports this module, as its setup cell did.
``expect_pattern`` and ``expect_only`` run in the judge, on what the ranks sent back and on what the
kernel counted from outside them.
"""

from torch.utils._python_dispatch import TorchDispatchMode

from .checks import expect

CHECK_TIMEOUT = 15  # seconds: a deadlocked answer fails instead of hanging


class CommunicationLog(TorchDispatchMode):
    # Inside a check's worker: records every communication operation that reaches torch's
    # dispatcher (c10d::allreduce_, c10d::send, ...), whatever name, module path or
    # ProcessGroup object the Python code used to call it.
    def __init__(self):
        super().__init__()
        self.ran = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        if name.startswith("c10d::"):
            self.ran.append(name.removeprefix("c10d::").rstrip("_"))
        return func(*args, **(kwargs or {}))


def backend_operations(fn, *args):
    # Returns (fn's result, the sorted names of the communication operations it ran).
    with CommunicationLog() as log:
        result = fn(*args)
    return result, sorted(set(log.ran))


def expect_pattern(measurements, expected, tensor_bytes, scheme, hint):
    # What arrived between every pair of ranks vs `expected[i][j]`, the bytes the exercise's scheme sends from
    # rank i to rank j. Read from outside the ranks: the kernel's count per TCP connection between two rank
    # processes (course_lib.confine.tcp_flows), whatever the ranks' code says it ran. Rendezvous adds a few KB.
    if measurements[0]["sent_to"] is None:
        print("(note: this OS does not count the bytes between processes; the byte check was skipped)")
        return
    slack = 8192 + 0.05 * tensor_bytes
    sent = [m["sent_to"] for m in measurements]
    pairs = [(i, j) for i in range(len(sent)) for j in range(len(sent)) if i != j]
    wrong = [f"rank {i} sent rank {j} {sent[i][j] / tensor_bytes:.2f} tensors, {scheme} sends "
             f"{expected[i][j] / tensor_bytes:.2f}" for i, j in pairs if abs(sent[i][j] - expected[i][j]) > slack]
    expect(not wrong, "the bytes between the ranks", "; ".join(wrong[:4]), hint=hint)
    elsewhere = max(m["sent_to_others"] for m in measurements)
    expect(elsewhere <= slack, "the bytes the ranks sent to other processes", f"were {elsewhere / tensor_bytes:.2f} "
           "tensors", hint="the ranks communicate with each other only, over the process group")


# The log of operations can only take points away: code in a rank can hide an operation from it, never
# add bytes between ranks that its scheme does not send; the byte rule above is what a scheme is held to.
def expect_only(ran, allowed, who):
    others = [name for name in ran if name not in allowed]
    expect(not others, who, f"ran {', '.join(others)}, but this exercise allows only {', '.join(allowed)}",
           hint="build the result from the allowed operations; the built-in collective under another name "
                "still runs the same operation")
