"""NN-Descent: GNND on the GPU (``_gpu.py`` + ``gnnd.cu``), the Numba twin on the CPU (``_cpu.py``).

Paper: Wang, Zhao & Zeng, "Large-Scale Approximate k-NN Graph Construction on GPU", section 4.
"""
