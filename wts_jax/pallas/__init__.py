"""The Pallas kernels (GPU). Import submodules directly; nothing here pulls in a backend."""
