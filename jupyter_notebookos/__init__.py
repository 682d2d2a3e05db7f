"""NotebookOS: GPU-efficient, replicated notebook kernels on Jupyter Enterprise Gateway."""

__version__ = "0.1.0"
