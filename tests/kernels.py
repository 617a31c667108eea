"""The Jupyter kernel the tests run notebooks in: this interpreter's own."""
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

KERNEL_NAME = "python3"


def this_interpreters_kernel() -> AsyncKernelManager:
    """The python3 kernel of *this* interpreter (sys.executable).

    Jupyter's kernelspec search would let a stale user-level
    ~/.local/share/jupyter/kernels/python3 win; with no kernel dirs,
    jupyter_client falls back to ipykernel's native spec, whose argv is
    [sys.executable, "-m", "ipykernel_launcher", ...].
    """
    return AsyncKernelManager(kernel_name=KERNEL_NAME,
                              kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))
