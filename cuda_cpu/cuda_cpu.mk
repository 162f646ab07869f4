# cuda_cpu/cuda_cpu.mk: the CPU execution layer's build: its runtime library and its own tests.
# Included by cuda_cpu/Makefile (the layer on its own) and by the project's Makefile; both set
#   CUDA_CPU_DIR        the layer's folder, as make sees it (cuda_cpu, or . from inside it)
#   CUDA_CPU_BUILD      build/cuda_cpu beside that folder: where nvcc links the library from
#   CUDA_HOME           the CUDA headers (cuda_headers.sh); NCCL_HOME, BLAS_INC if elsewhere
#   CUDA_CPU_MPI_FLAGS  MPI's flags in nvcc's form, for the NCCL test only
# Every target here is built with the layer's nvcc, whatever the including build's NVCC.

CUDA_CPU_NVCC = $(CUDA_CPU_DIR)/nvcc
CUDA_CPU_A = $(CUDA_CPU_BUILD)/libcuda_cpu.a
CUDA_CPU_SRC = $(wildcard $(CUDA_CPU_DIR)/*.cpp)
CUDA_CPU_OBJ = $(patsubst $(CUDA_CPU_DIR)/%.cpp,$(CUDA_CPU_BUILD)/%.o,$(CUDA_CPU_SRC))
CUDA_CPU_H = $(addprefix $(CUDA_CPU_DIR)/,internal.h tools.h kernel_attributes.h tensorcore.h cuda_cpu.h include/mma.h)
# Its sources are plain C++ against the toolkit's headers (their types and prototypes);
# NCCL_HOME's nccl.h first, as for the GPU build.
CUDA_CPU_CXXFLAGS = -std=c++17 -O2 -g -pthread -Wall -Wno-unused-function $(if $(BLAS_INC),-I$(BLAS_INC)) \
  $(if $(NCCL_HOME),-isystem $(NCCL_HOME)/include) -isystem $(CUDA_HOME)/include

$(CUDA_CPU_BUILD)/%.o: $(CUDA_CPU_DIR)/%.cpp $(CUDA_CPU_H)
	@mkdir -p $(CUDA_CPU_BUILD)
	g++ $(CUDA_CPU_CXXFLAGS) -c $< -o $@
$(CUDA_CPU_A): $(CUDA_CPU_OBJ)
	rm -f $@ && ar rcs $@ $^

# ---- the layer's own tests (tests/run_layer_tests.sh runs them) ----
# Kernels, launches, memory and streams (test_layer), cuBLAS/cuBLASLt (test_blas), NCCL
# (test_nccl, under mpirun), the sanitizer and profiler (test_tools), memcheck
# (test_memcheck), the host/library boundary (test_boundary: memcheck at MPI, pageable
# copies), GPU numerics (test_numerics, test_tensorcore), and the layer's speed (bench_layer,
# the project's make bench). Flags of their own: a build's CUDA_CPU_TOOLS or PRECISION changes
# nothing here.
CUDA_CPU_T = $(CUDA_CPU_DIR)/tests
CUDA_CPU_TB = $(CUDA_CPU_BUILD)/tests
CUDA_CPU_TESTS = $(addprefix $(CUDA_CPU_TB)/,test_layer test_blas test_nccl test_tools test_memcheck test_numerics \
  test_device_memory test_boundary test_tensorcore)
CUDA_CPU_TEST_DEPS = $(CUDA_CPU_A) $(CUDA_CPU_NVCC) $(CUDA_CPU_DIR)/rewrite.py $(CUDA_CPU_T)/layer_test.h
CUDA_CPU_INCLUDES = $(if $(NCCL_HOME),-I$(NCCL_HOME)/include)
CUDA_CPU_TEST_FLAGS = -O3 -std=c++17 $(CUDA_CPU_INCLUDES)
# The sanitizer, memcheck and profiler are tested in a build with the tools (memcheck's with a
# C file, compiled by gcc as the project's C sources are), GPU numerics in a numerics build:
# one file with --use_fast_math, one with -fmad=false and without it.
CUDA_CPU_TOOLS_FLAGS = $(CUDA_CPU_TEST_FLAGS) --cuda-cpu-tools
CUDA_CPU_NUMERICS_FLAGS = $(CUDA_CPU_TEST_FLAGS) --cuda-cpu-numerics=gpu

$(CUDA_CPU_TB)/test_layer: $(CUDA_CPU_T)/test_layer.cu $(CUDA_CPU_T)/two_workers.cuh $(CUDA_CPU_T)/launch_resources.cuh \
  $(CUDA_CPU_TEST_DEPS)
	@mkdir -p $(@D)
	$(CUDA_CPU_NVCC) $(CUDA_CPU_TEST_FLAGS) $< -o $@
$(CUDA_CPU_TB)/test_device_memory: $(CUDA_CPU_T)/test_device_memory.cu $(CUDA_CPU_TEST_DEPS)
	@mkdir -p $(@D)
	$(CUDA_CPU_NVCC) $(CUDA_CPU_TEST_FLAGS) $< -o $@
$(CUDA_CPU_TB)/test_blas: $(CUDA_CPU_T)/test_blas.cpp $(CUDA_CPU_TEST_DEPS)
	@mkdir -p $(@D)
	$(CUDA_CPU_NVCC) -O2 $(CUDA_CPU_INCLUDES) $< -o $@
$(CUDA_CPU_TB)/test_nccl: $(CUDA_CPU_T)/test_nccl.cpp $(CUDA_CPU_TEST_DEPS)
	$(if $(strip $(CUDA_CPU_MPI_FLAGS)),,$(error no MPI flags for the NCCL test: is MPI installed (mpicc)?))
	@mkdir -p $(@D)
	$(CUDA_CPU_NVCC) -O2 $(CUDA_CPU_INCLUDES) $< -o $@ $(CUDA_CPU_MPI_FLAGS)
$(CUDA_CPU_TB)/test_tools: $(CUDA_CPU_T)/test_tools.cu $(CUDA_CPU_TEST_DEPS)
	@mkdir -p $(@D)
	$(CUDA_CPU_NVCC) $(CUDA_CPU_TOOLS_FLAGS) $< -o $@
$(CUDA_CPU_TB)/test_memcheck: $(CUDA_CPU_T)/test_memcheck.cu $(CUDA_CPU_T)/memcheck_host.c $(CUDA_CPU_TEST_DEPS)
	@mkdir -p $(@D)
	$(CUDA_CPU_NVCC) $(CUDA_CPU_TOOLS_FLAGS) $< $(CUDA_CPU_T)/memcheck_host.c -o $@
# The host/library boundary: memcheck at MPI (mpi_check.c, against MPI's own mpi.h) and the
# pageable copies' switches.
$(CUDA_CPU_TB)/test_boundary: $(CUDA_CPU_T)/test_boundary.cu $(CUDA_CPU_DIR)/mpi_check.c $(CUDA_CPU_TEST_DEPS)
	$(if $(strip $(CUDA_CPU_MPI_FLAGS)),,$(error no MPI flags for the boundary test: is MPI installed (mpicc)?))
	@mkdir -p $(@D)
	$(CUDA_CPU_NVCC) $(CUDA_CPU_TOOLS_FLAGS) $< $(CUDA_CPU_DIR)/mpi_check.c -o $@ $(CUDA_CPU_MPI_FLAGS)
$(CUDA_CPU_TB)/test_numerics: $(CUDA_CPU_T)/test_numerics.cu $(CUDA_CPU_T)/numerics_precise.cu $(CUDA_CPU_T)/two_workers.cuh \
  $(CUDA_CPU_TEST_DEPS)
	@mkdir -p $(@D)
	$(CUDA_CPU_NVCC) $(CUDA_CPU_NUMERICS_FLAGS) -fmad=false -c $(CUDA_CPU_T)/numerics_precise.cu -o $(@D)/numerics_precise.o
	$(CUDA_CPU_NVCC) $(CUDA_CPU_NUMERICS_FLAGS) --use_fast_math $< $(@D)/numerics_precise.o -o $@
# The tensor-core model (tensorcore.cpp): a GPU-numerics build.
$(CUDA_CPU_TB)/test_tensorcore: $(CUDA_CPU_T)/test_tensorcore.cu $(CUDA_CPU_TEST_DEPS)
	@mkdir -p $(@D)
	$(CUDA_CPU_NVCC) $(CUDA_CPU_NUMERICS_FLAGS) $< -o $@ -lcublas
$(CUDA_CPU_TB)/bench_layer: $(CUDA_CPU_T)/bench_layer.cu $(CUDA_CPU_TEST_DEPS)
	@mkdir -p $(@D)
	$(CUDA_CPU_NVCC) $(CUDA_CPU_TEST_FLAGS) $< -o $@
