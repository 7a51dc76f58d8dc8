"""Keeping processes apart and measuring them from outside: below both the launcher and the grader.

Introduced with chapter 01's graded exercises. ``apart`` is what each rank of a graded launch applies
to itself before any learner code (a Landlock domain of its own, a seccomp allowlist of sockets);
``tcp_flows`` reads, from outside the ranks, the bytes each sent each other over TCP, and ``socket_memory``
what their sockets hold in the kernel (both through ``sock_diag``); ``cgroups`` holds a group of processes
to a limit on tasks and memory and to one share of the CPU; ``out_of_memory`` has the OOM killer pick a
rank before the notebook's kernel and tells the launcher when it struck (introduced with the class hub). The launcher (course_lib.launcher) calls the
first two from its ranks and its measurements; the grader's sandbox (course_lib.grading.sandbox) uses
them all. Nothing here imports either of them.
"""
