# Installed by `make` into the course's environment (.venv/etc/jupyter/): the JupyterLab of `make lab`,
# `make lab-server` and the class hub read it.
#
# A kernel and its server talk over ZeroMQ. Over TCP (Jupyter's default) that is five ports on 127.0.0.1
# that any local user can connect to (each message is signed with the kernel's key, but the traffic is
# plain text), and every kernel start logs "Kernel is running over TCP without encryption". On Linux
# the course uses IPC instead: Unix sockets beside the kernel's connection file, in the user's private
# runtime folder, which no other user can open. (macOS keeps TCP: a Unix socket's path there may hold at
# most 104 bytes, which a long home folder's runtime path can exceed; the warning means what it says,
# and the kernel's key still keeps other users from running code in it.)
import sys

if sys.platform.startswith("linux"):
    c.KernelManager.transport = "ipc"  # noqa: F821 - `c` is the config object Jupyter provides
