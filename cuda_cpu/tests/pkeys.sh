# Sourced by the layer's test scripts: CUDA_CPU_PROTECT=1 needs memory protection keys (x86
# PKU, enabled by the kernel); many virtual machines hide them. pkeys_available asks the
# kernel itself, as the layer does (pkey_alloc through python3's ctypes).
pkeys_available() {
    python3 -c 'import ctypes, sys; libc = ctypes.CDLL(None); k = libc.pkey_alloc(0, 0); sys.exit(0 if k >= 0 else 1)' \
        2>/dev/null
}
PKEYS_SKIPPED="this CPU or kernel has no memory protection keys (pkey_alloc fails)"  # a test_lib.sh skip's reason
