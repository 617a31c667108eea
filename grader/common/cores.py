"""How a kernel's threads behave where it shares the cores with other notebooks.

Imported by the jail's launcher at every kernel's start: nothing here imports anything.
"""

#: OpenMP threads that sleep while they wait, instead of spinning. Where notebooks share cores (a
#: grading run's --jobs, the test suite's two workers), a kernel's spinning threads take the cores
#: another notebook needs, and each parallel region waits for a thread that is not running: lab 1
#: on 2 threads beside one busy core ran 125 s spinning, 15 s sleeping (14.5 s either way on idle
#: cores). Results do not change: how a thread waits is not how the work is split.
SHARED_CORES_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
