# llm.c-style GPT-2 trainers with the zero1/ ZeRO-1 plugin.
#   make train_gpt2 [USE_ZERO1=1]     CPU trainer (C11, OpenMP, OpenBLAS, MPI)
#   make train_gpt2cu [USE_ZERO1=1]   GPU trainer (CUDA, cuBLASLt, NCCL); PRECISION=BF16|FP32, GPU_ARCH=90
#                     [USE_CUDNN=1]   with cuDNN's fused attention (--attention cudnn; BF16 only): the frontend
#                                     headers from scripts/get_cudnn_frontend.sh (CUDNN_FRONTEND_PATH), cuDNN
#                                     from the toolkit or CUDNN_HOME=.../site-packages/nvidia/cudnn
#   make test_zero1_cuda              zero1's CUDA device ops and NCCL communicator (runs on a GPU)
#   make test_watchdog_cuda           the GPU step's deadline (zero1/watchdog_cuda.h; runs on a GPU)
#   make zero1_plan                   the ZeRO-1 layout planner
#   make gpt2_cost                    the cost model: predicted GPU step time, tokens/s, MFU
#   make hf_convert                   llm.c model files <-> Hugging Face GPT-2 (export, import)
#   make test / test_gpu / bench / demo
#   make ... CUDA_ON_CPU=1            the same GPU targets, built to run on the CPU (cuda_cpu/: the
#                                     CPU execution layer for CUDA; no GPU, no NVIDIA library needed)
# Other toolchains: MPICC=mpicc.mpich (any MPI's compiler wrapper: Open MPI 4/5, MPICH),
# CUDA_HOME=/opt/cuda (nvcc, headers, libraries; NVCC=... overrides nvcc alone),
# NCCL_HOME=/opt/nccl (include/ and lib/ of an NCCL outside the CUDA toolkit), CUDNN_HOME likewise for cuDNN.

MPICC ?= mpicc
ifeq ($(origin CC),default)
CC := $(MPICC)
endif
# Without CUDA_HOME: /usr/local/cuda if it holds nvcc, else wherever the nvcc on PATH lives.
ifeq ($(CUDA_HOME),)
CUDA_HOME := $(if $(wildcard /usr/local/cuda/bin/nvcc),/usr/local/cuda,$(patsubst %/bin/nvcc,%,$(shell command -v nvcc 2>/dev/null)))
endif
NVCC ?= $(if $(CUDA_HOME),$(CUDA_HOME)/bin/nvcc,nvcc)
# CUDA_ON_CPU=1: the CPU execution layer (cuda_cpu/) as the toolchain: cuda_cpu/nvcc takes
# nvcc's place (g++ on rewritten sources, linked with the layer's runtime library, its cuBLAS
# and NCCL, instead of NVIDIA's).
CUDA_ON_CPU ?= 0
ifeq ($(CUDA_ON_CPU),1)
NVCC := cuda_cpu/nvcc
CUDA_CPU_LIB := build/cuda_cpu/libcuda_cpu.a
# The layer needs the toolkit's headers only: without them, those of NVIDIA's PyPI wheels
# (cuda_cpu/cuda_headers.sh, cached in ~/.cache/llmc-cuda-headers; CUDA_HOME as it was if
# that fails, with its "SKIPPED:" line on stderr). cuda_cpu/nvcc reads it from the environment.
CUDA_HOME := $(or $(shell CUDA_HOME='$(CUDA_HOME)' bash cuda_cpu/cuda_headers.sh),$(CUDA_HOME))
export CUDA_HOME
endif
# CUDA_CPU_TOOLS=1 (with CUDA_ON_CPU=1): kernels built for the layer's sanitizer and profiler
# (CUDA_CPU_CHECK=race|memcheck, CUDA_CPU_PROFILE=FILE; docs/cuda_cpu.md); slower, so a build of its own.
CUDA_CPU_TOOLS ?= 0
ifeq ($(CUDA_CPU_TOOLS),1)
ifneq ($(CUDA_ON_CPU),1)
$(error CUDA_CPU_TOOLS=1 needs CUDA_ON_CPU=1: the sanitizer and profiler are the CPU execution layer's)
endif
endif
# CUDA_CPU_NUMERICS=gpu (with CUDA_ON_CPU=1): kernels built with the freedoms nvcc takes with
# float math (fused multiply-adds; --use_fast_math's approximations and flushed denormals), each
# at its documented worst (cuda_cpu/nvcc, docs/cuda_cpu.md); ieee (the default): none.
CUDA_CPU_NUMERICS ?= ieee
ifeq ($(CUDA_CPU_NUMERICS),gpu)
ifneq ($(CUDA_ON_CPU),1)
$(error CUDA_CPU_NUMERICS=gpu needs CUDA_ON_CPU=1: nvcc takes these freedoms itself on a GPU)
endif
else ifneq ($(CUDA_CPU_NUMERICS),ieee)
$(error CUDA_CPU_NUMERICS=$(CUDA_CPU_NUMERICS): use ieee or gpu)
endif
USE_ZERO1 ?= 0
USE_CUDNN ?= 0
PRECISION ?= BF16
GPU_ARCH ?= 90

# -fno-fast-math on purpose: the trainer is checked element by element against PyTorch.
# -fno-math-errno changes no result (nothing reads errno after a math function): it lets
# loops with sqrtf vectorise (AdamW's).
CFLAGS ?= -O3 -march=native
CFLAGS += -std=c11 -D_DEFAULT_SOURCE -fno-math-errno -Wall -Wextra -Werror=implicit-function-declaration -Wno-unused-parameter -Wno-unused-function -fopenmp -I.
BLAS_INC := $(firstword $(wildcard /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/aarch64-linux-gnu/openblas-pthread /usr/include/openblas))
ifneq ($(BLAS_INC),)
CFLAGS += -I$(BLAS_INC)
endif
LDLIBS = $(RUN_LIB) -lopenblas -lm

# run/: the library that owns a run (its configuration, output directory, checkpoints, data,
# logs, deadlines and evals), compiled once per toolchain into build/run/librun.a; every
# program links it (llmc/ and zero1/ call its fatal()).
RUN_SRC = $(wildcard run/*.c)
RUN_OBJ = $(patsubst run/%.c,build/run/%.o,$(RUN_SRC))
RUN_LIB = build/run/librun.a
# run/'s one CUDA file, the NCCL bootstrap and check of the GPU trainer and of zero1/'s NCCL
# communicator: an object of every GPU build.
RUN_CUDA_OBJ = build/run/nccl_comm.o

ZERO1_CORE_SRC = zero1/layout.c zero1/shards.c
ZERO1_RUNTIME_SRC = zero1/runtime.c zero1/checkpoint.c zero1/optimizer.c zero1/comm_mpi.c zero1/comm_single.c \
  zero1/device_cpu.c zero1/trace.c zero1/split_embedding.c
# The test doubles (the deferred device, the hazard communicator): test binaries only.
ZERO1_TEST_SRC = zero1/testing/device_deferred.c zero1/testing/comm_hazard.c
ZERO1_CPU_SRC = $(ZERO1_CORE_SRC) $(ZERO1_RUNTIME_SRC) zero1/backend_cpu.c
ZERO1_GPU_SRC = $(ZERO1_CORE_SRC) $(ZERO1_RUNTIME_SRC)
# The CUDA device ops, the NCCL communicator and the GPU backend, built as objects with
# their own flags (below).
ZERO1_CUDA_SRC = zero1/device_cuda.cu zero1/comm_nccl.cu
ZERO1_CUDA_OBJ = $(ZERO1_CUDA_SRC:.cu=.o)
ifeq ($(USE_ZERO1),1)
CPU_PLUGIN_SRC = $(ZERO1_CPU_SRC)
GPU_PLUGIN_SRC = $(ZERO1_GPU_SRC) zero1/backend_cuda.cu $(ZERO1_CUDA_OBJ)
ZERO1_DEF = -DUSE_ZERO1
PLUGIN_TEST_SRC = $(ZERO1_TEST_SRC)
endif
# The make line of this build with the plugin, for the trainers' "rebuild with" hints: the
# variables that differ from their defaults.
TOOLCHAIN_ARGS = $(if $(filter-out mpicc,$(MPICC)), MPICC=$(MPICC))
CPU_REBUILD = -DREBUILD_WITH_ZERO1='"make train_gpt2 USE_ZERO1=1$(TOOLCHAIN_ARGS)"'
GPU_REBUILD = -DREBUILD_WITH_ZERO1='"make train_gpt2cu USE_ZERO1=1$(if $(filter 1,$(CUDA_ON_CPU)), CUDA_ON_CPU=1)$(if \
  $(filter-out BF16,$(PRECISION)), PRECISION=$(PRECISION))$(if $(filter 1,$(USE_CUDNN)), USE_CUDNN=1)$(if \
  $(filter-out 90,$(GPU_ARCH)), GPU_ARCH=$(GPU_ARCH))$(TOOLCHAIN_ARGS)"'

HOST_HEADERS = $(wildcard llmc/*.h) $(wildcard run/*.h) $(wildcard zero1/*.h)
TOOL_HEADERS = $(HOST_HEADERS) $(wildcard tools/*.h)

# The binaries' names do not say how they were built, so the build variables are kept in
# stamp files that change only when the variables do: switching USE_ZERO1 or PRECISION
# rebuilds, repeating a build does not.
# The toolchain counts too: a binary linked against another MPI must not survive a switch.
# A stamp is a target, rewritten only when a goal depends on it and its variables changed
# (stamp_stale makes it depend on .stamp-stale then): `make data` leaves the trainer's alone.
stamp_stale = $(shell echo "$(2)" | cmp -s - $(1) || echo .stamp-stale)
CPU_STAMP := .build-cpu.stamp
GPU_STAMP := .build-gpu.stamp
CPU_BUILD := USE_ZERO1=$(USE_ZERO1) CC=$(shell command -v $(CC) 2>/dev/null || echo $(CC))
GPU_BUILD := CUDA_ON_CPU=$(CUDA_ON_CPU) CUDA_CPU_TOOLS=$(CUDA_CPU_TOOLS) CUDA_CPU_NUMERICS=$(CUDA_CPU_NUMERICS) USE_ZERO1=$(USE_ZERO1) USE_CUDNN=$(USE_CUDNN) PRECISION=$(PRECISION) GPU_ARCH=$(GPU_ARCH) NVCC=$(NVCC) NCCL_HOME=$(NCCL_HOME) \
             MPICC=$(shell command -v $(MPICC) 2>/dev/null || echo $(MPICC))
# (Rules, but never the default goal: their names start with a dot.)
.PHONY: .stamp-stale
.stamp-stale:
$(CPU_STAMP): $(call stamp_stale,$(CPU_STAMP),$(CPU_BUILD))
	@echo "$(CPU_BUILD)" > $@
$(GPU_STAMP): $(call stamp_stale,$(GPU_STAMP),$(GPU_BUILD))
	@echo "$(GPU_BUILD)" > $@
# run/ is compiled by $(MPICC), whose MPI its collectives are written against, whatever CC
# compiles a program's own files; so a build of the tools leaves it alone.
RUN_STAMP := .build-run.stamp
RUN_BUILD := MPICC=$(shell command -v $(MPICC) 2>/dev/null || echo $(MPICC)) CFLAGS=$(CFLAGS)
$(RUN_STAMP): $(call stamp_stale,$(RUN_STAMP),$(RUN_BUILD))
	@echo "$(RUN_BUILD)" > $@
build/run/%.o: run/%.c $(HOST_HEADERS) $(RUN_STAMP)
	@mkdir -p build/run
	$(MPICC) $(CFLAGS) -c $< -o $@
$(RUN_LIB): $(RUN_OBJ)
	rm -f $@ && ar rcs $@ $^
CUDA_HEADERS = $(wildcard llmc/*.cuh) $(CUDA_CPU_LIB)

.PHONY: all test test_gpu bench demo clean data cuda cuda_cpu

all: train_gpt2 zero1_plan gpt2_cost prepro_text prepro_corpus hf_convert

train_gpt2: train_gpt2.c $(HOST_HEADERS) $(CPU_PLUGIN_SRC) $(CPU_STAMP) $(RUN_LIB)
	$(CC) $(CFLAGS) $(ZERO1_DEF) $(CPU_REBUILD) train_gpt2.c $(CPU_PLUGIN_SRC) -o $@ $(LDLIBS)

# The trainer without the plugin under its own name, so tests can run both builds.
train_gpt2_plain: train_gpt2.c $(HOST_HEADERS) $(RUN_LIB)
	$(CC) $(CFLAGS) $(CPU_REBUILD) train_gpt2.c -o $@ $(LDLIBS)

# The test binaries that include a trainer add the test options and the test doubles
# (dev/test/testing_options.h). The oracle harness is built the same way as the trainer.
TEST_HEADERS = $(HOST_HEADERS) $(wildcard dev/test/*.h) $(wildcard zero1/testing/*.h)
test_gpt2: dev/test/test_gpt2.c train_gpt2.c $(TEST_HEADERS) $(CPU_PLUGIN_SRC) $(PLUGIN_TEST_SRC) $(CPU_STAMP) $(RUN_LIB)
	$(CC) $(CFLAGS) $(ZERO1_DEF) dev/test/test_gpt2.c $(CPU_PLUGIN_SRC) $(PLUGIN_TEST_SRC) -o $@ $(LDLIBS)

# The CPU trainer with the test options, for scripts that run it on the test doubles.
train_gpt2_testing: dev/test/train_gpt2_testing.c train_gpt2.c $(TEST_HEADERS) $(ZERO1_CPU_SRC) $(ZERO1_TEST_SRC) $(RUN_LIB)
	$(CC) $(CFLAGS) -DUSE_ZERO1 dev/test/train_gpt2_testing.c $(ZERO1_CPU_SRC) $(ZERO1_TEST_SRC) -o $@ $(LDLIBS)

# The zero1 runtime alone (one rank, no MPI) against dense AdamW.
ZERO1_NO_MPI_SRC = zero1/runtime.c zero1/split_embedding.c zero1/checkpoint.c zero1/comm_single.c zero1/device_cpu.c zero1/trace.c $(ZERO1_TEST_SRC)
test_zero1_runtime: dev/test/test_zero1_runtime.c $(ZERO1_NO_MPI_SRC) $(ZERO1_CORE_SRC) $(HOST_HEADERS) $(RUN_LIB)
	gcc $(CFLAGS) dev/test/test_zero1_runtime.c $(ZERO1_NO_MPI_SRC) $(ZERO1_CORE_SRC) -o $@ $(RUN_LIB) -lm

# The test device and communicator (deferred, hazard) against their contracts; MPI for
# `mpirun -np N ./test_zero1_devices --mpi`.
ZERO1_DEVICES_SRC = $(ZERO1_TEST_SRC) zero1/device_cpu.c zero1/comm_single.c zero1/comm_mpi.c
test_zero1_devices: dev/test/test_zero1_devices.c $(ZERO1_DEVICES_SRC) $(HOST_HEADERS) $(RUN_LIB)
	$(CC) $(CFLAGS) dev/test/test_zero1_devices.c $(ZERO1_DEVICES_SRC) -o $@ $(RUN_LIB) -lm

# The CPU kernels against naive double-precision references and finite differences.
test_kernels: dev/test/test_kernels.c $(HOST_HEADERS) $(RUN_LIB)
	gcc $(CFLAGS) dev/test/test_kernels.c -o $@ $(LDLIBS)

# OpenBLAS sgemm GFLOP/s with the kernels run/blas_cores.h picks (make bench).
bench_sgemm: dev/test/bench_sgemm.c $(HOST_HEADERS) $(RUN_LIB)
	gcc $(CFLAGS) dev/test/bench_sgemm.c -o $@ $(LDLIBS)

# ZeRO-1 vs replicated, step by step (always with the plugin).
test_zero1: dev/test/test_zero1.c train_gpt2.c $(TEST_HEADERS) $(ZERO1_CPU_SRC) $(ZERO1_TEST_SRC) $(RUN_LIB)
	$(CC) $(CFLAGS) -DUSE_ZERO1 dev/test/test_zero1.c $(ZERO1_CPU_SRC) $(ZERO1_TEST_SRC) -o $@ $(LDLIBS)

# run/mpi_wait.h: the trainers' host collectives under --comm-timeout (dev/test/test_faults.sh).
test_mpi_wait: dev/test/test_mpi_wait.c $(HOST_HEADERS) $(RUN_LIB)
	$(CC) $(CFLAGS) dev/test/test_mpi_wait.c -o $@ $(RUN_LIB) -lm

# run/crc32c.h: vectors, SSE4.2 vs portable, combine (dev/test/test_crc32c.sh runs it).
test_crc32c: dev/test/test_crc32c.c $(HOST_HEADERS) $(RUN_LIB)
	gcc $(CFLAGS) dev/test/test_crc32c.c -o $@ $(RUN_LIB) -lm

# Data preparation: text -> llm.c token shards + tokenizer file, with GPT-2's BPE.
prepro_text: tools/prepro_text.c $(TOOL_HEADERS) $(RUN_LIB)
	gcc $(CFLAGS) tools/prepro_text.c -o $@ $(RUN_LIB) -lm

# JSONL (plain, zstd, gzip) and text corpora -> shards, tokenized on every core (Debian's
# libjansson-dev, libzstd-dev, zlib1g-dev: scripts/install_deps.sh).
prepro_corpus: tools/prepro_corpus.c $(TOOL_HEADERS) $(RUN_LIB)
	gcc $(CFLAGS) -pthread tools/prepro_corpus.c -o $@ -ljansson -lzstd -lz $(RUN_LIB) -lm

# llm.c model files and checkpoints <-> Hugging Face GPT-2 (model.safetensors + config.json).
hf_convert: tools/hf_convert.c $(TOOL_HEADERS) $(RUN_LIB)
	gcc $(CFLAGS) tools/hf_convert.c -o $@ $(RUN_LIB) -lm

zero1_plan: zero1/zero1_plan.c $(ZERO1_CORE_SRC) $(HOST_HEADERS) $(RUN_LIB)
	gcc $(CFLAGS) zero1/zero1_plan.c $(ZERO1_CORE_SRC) -o $@ $(RUN_LIB) -lm

# The cost model: a FLOP and byte count of the GPU step, its roofline time (dev/cost/cost_model.h)
gpt2_cost: dev/cost/gpt2_cost.c dev/cost/cost_model.h $(ZERO1_CORE_SRC) $(HOST_HEADERS) $(RUN_LIB)
	gcc $(CFLAGS) dev/cost/gpt2_cost.c $(ZERO1_CORE_SRC) -o $@ $(RUN_LIB) -lm

# Unit tests of the zero1 core (no MPI).
test_zero1_layout: dev/test/test_zero1_layout.c $(ZERO1_CORE_SRC) $(HOST_HEADERS) $(RUN_LIB)
	gcc $(CFLAGS) dev/test/test_zero1_layout.c $(ZERO1_CORE_SRC) -o $@ $(RUN_LIB) -lm

# ---- GPU ----
# --use_fast_math only for BF16: it turns tanhf (GELU) and expf into approximations with
# relative errors near 2^-11, which would eat most of the FP32 build's margin against the
# PyTorch oracle; BF16 rounds far more coarsely than that anyway.
NVCC_FLAGS = -O3 -std=c++17 -Xcompiler -fopenmp -lineinfo \
  -gencode arch=compute_$(GPU_ARCH),code=sm_$(GPU_ARCH) -gencode arch=compute_$(GPU_ARCH),code=compute_$(GPU_ARCH)
ifeq ($(PRECISION),FP32)
NVCC_FLAGS += -DENABLE_FP32
else
NVCC_FLAGS += -DENABLE_BF16 --use_fast_math
endif
ifeq ($(CUDA_CPU_TOOLS),1)
NVCC_FLAGS += --cuda-cpu-tools
endif
ifeq ($(CUDA_CPU_NUMERICS),gpu)
NVCC_FLAGS += --cuda-cpu-numerics=gpu
endif
# NCCL_HOME before CUDA_HOME, so that its nccl.h and libnccl win over a toolkit's own.
CUDA_LIB_DIR = $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib))
NVCC_INCLUDES = -I. $(if $(NCCL_HOME),-I$(NCCL_HOME)/include) $(if $(CUDA_HOME),-I$(CUDA_HOME)/include)
# A run path to each library directory linked against, so that the binary finds libcublasLt,
# libcublas and libnccl without ldconfig; RUNPATH (--enable-new-dtags), so LD_LIBRARY_PATH
# still overrides it (docs/building.md, "Run paths").
nvcc_rpath = -Xlinker -rpath -Xlinker $(abspath $(1))
NVCC_LIB_DIRS = $(if $(NCCL_HOME),-L$(NCCL_HOME)/lib $(call nvcc_rpath,$(NCCL_HOME)/lib)) \
  $(if $(CUDA_LIB_DIR),-L$(CUDA_LIB_DIR) $(call nvcc_rpath,$(CUDA_LIB_DIR))) -Xlinker --enable-new-dtags
# The MPI wrapper's flags, translated for nvcc (Open MPI 5 and MPICH pass gcc-only flags).
# Expanded only when a GPU target builds; a wrapper that answers nothing stops the build.
MPI_NVCC_CFLAGS = $(shell bash scripts/mpi_nvcc_flags.sh compile $(MPICC))
MPI_NVCC_LDFLAGS = $(shell bash scripts/mpi_nvcc_flags.sh link $(MPICC))
NVCC_LIBS = $(NVCC_LIB_DIRS) -lcublasLt -lcublas -lnccl $(MPI_NVCC_LDFLAGS) -lgomp
check_mpi_flags = $(if $(strip $(MPI_NVCC_LDFLAGS)),,$(error no MPI link flags from $(MPICC); see the error above))

# USE_CUDNN=1: llmc/cudnn_attention.cpp, an object of its own against cuDNN's C++ frontend
# (header-only; scripts/get_cudnn_frontend.sh) and libcudnn: the toolkit's when it has
# cudnn.h, else CUDNN_HOME (include/, lib/: the nvidia-cudnn-cu13 wheel's nvidia/cudnn), else
# that wheel in python3's site-packages. The object is host code run once per shape: -O1 and
# no JSON serialisation halve the frontend's compile time. Its own stamp, so switching
# USE_ZERO1 or PRECISION does not recompile it. A missing piece stops only the builds that
# need it (check_cudnn in their recipes), with the fix in the message.
ifeq ($(USE_CUDNN),1)
ifeq ($(CUDA_ON_CPU),1)
$(error USE_CUDNN=1 with CUDA_ON_CPU=1: the CPU execution layer has no cuDNN; drop one of them)
endif
ifeq ($(PRECISION),FP32)
$(error USE_CUDNN=1 with PRECISION=FP32: cuDNN's attention has no fp32 path; build PRECISION=BF16 USE_CUDNN=1)
endif
CUDNN_FRONTEND_PATH ?= build/cudnn_frontend/include
ifeq ($(CUDNN_HOME),)
CUDNN_HOME := $(if $(wildcard $(CUDA_HOME)/include/cudnn.h),$(CUDA_HOME),$(shell python3 -c \
  'import nvidia.cudnn as m; print(list(m.__path__)[0])' 2>/dev/null))
endif
CUDNN_LIB_DIR := $(firstword $(wildcard $(CUDNN_HOME)/lib64 $(CUDNN_HOME)/lib))
# The wheel has libcudnn.so.9 alone (no libcudnn.so to find with -lcudnn).
CUDNN_LIB := $(firstword $(wildcard $(CUDNN_LIB_DIR)/libcudnn.so $(CUDNN_LIB_DIR)/libcudnn.so.[0-9]*))
CUDNN_PROBLEM := \
  $(if $(wildcard $(CUDNN_FRONTEND_PATH)/cudnn_frontend.h),$(if $(wildcard $(CUDNN_HOME)/include/cudnn.h),$(if \
    $(CUDNN_LIB),,USE_CUDNN=1: no libcudnn.so* in $(CUDNN_HOME)/lib64 or $(CUDNN_HOME)/lib),USE_CUDNN=1: no cudnn.h \
    in $(CUDA_HOME)/include nor in CUDNN_HOME='$(CUDNN_HOME)': pip install nvidia-cudnn-cu13, or set CUDNN_HOME to a \
    cuDNN with include/ and lib/),USE_CUDNN=1: no cudnn_frontend.h in CUDNN_FRONTEND_PATH=$(CUDNN_FRONTEND_PATH): \
    run scripts/get_cudnn_frontend.sh (or point CUDNN_FRONTEND_PATH at the frontend's include/))
check_cudnn = $(if $(CUDNN_PROBLEM),$(error $(CUDNN_PROBLEM)))
NVCC_FLAGS += -DUSE_CUDNN
CUDNN_STAMP := .build-cudnn.stamp
CUDNN_BUILD := NVCC=$(NVCC) CUDNN_FRONTEND_PATH=$(CUDNN_FRONTEND_PATH) CUDNN_HOME=$(CUDNN_HOME)
$(CUDNN_STAMP): $(call stamp_stale,$(CUDNN_STAMP),$(CUDNN_BUILD))
	@echo "$(CUDNN_BUILD)" > $@
CUDNN_OBJ := build/cudnn_attention.o
# NVRTC: the frontend also compiles an experimental Blackwell engine that calls it (never
# used for attention, but linked).
CUDNN_LIBS = $(CUDNN_OBJ) -L$(CUDNN_LIB_DIR) -l:$(notdir $(CUDNN_LIB)) $(call nvcc_rpath,$(CUDNN_LIB_DIR)) -lnvrtc
build/cudnn_attention.o: llmc/cudnn_attention.cpp llmc/cudnn_attention.h llmc/gpt2_kernels.h run/config.h run/outliers.h \
  llmc/utils.h $(CUDNN_STAMP)
	$(check_cudnn)
	@mkdir -p build
	$(NVCC) -std=c++17 -O1 -DENABLE_BF16 -DUSE_CUDNN -DCUDNN_FRONTEND_SKIP_JSON_LIB -I. -I$(CUDNN_FRONTEND_PATH) \
	  $(if $(filter $(CUDA_HOME),$(CUDNN_HOME)),,-I$(CUDNN_HOME)/include) $(NVCC_INCLUDES) -c $< -o $@
# `make cudnn_check USE_CUDNN=1`: succeeds when every piece is there (scripts/check_cuda_build.sh).
.PHONY: cudnn_check
cudnn_check:
	$(check_cudnn)
	@echo "cuDNN: frontend $(CUDNN_FRONTEND_PATH), library $(CUDNN_LIB)"
endif

train_gpt2cu: train_gpt2.cu $(HOST_HEADERS) $(CUDA_HEADERS) $(GPU_PLUGIN_SRC) $(CUDNN_OBJ) $(GPU_STAMP) $(RUN_CUDA_OBJ) $(RUN_LIB)
	$(check_mpi_flags)
	$(check_cudnn)
	$(NVCC) $(NVCC_FLAGS) $(NVCC_INCLUDES) $(ZERO1_DEF) $(GPU_REBUILD) $(MPI_NVCC_CFLAGS) train_gpt2.cu $(GPU_PLUGIN_SRC) -o $@ \
	  $(CUDNN_LIBS) $(RUN_CUDA_OBJ) $(RUN_LIB) $(NVCC_LIBS)

# zero1's CUDA backend must give zero1/device_cpu.c's bits (AdamW, bf16 rounding, norm):
# the trainer's flags, but IEEE division and square root and no flushed denormals (no
# --use_fast_math), and no fused multiply-adds (the CPU build, ISO C, fuses none).
NVCC_EXACT_FLAGS = $(filter-out --use_fast_math,$(NVCC_FLAGS)) -fmad=false
$(ZERO1_CUDA_OBJ): zero1/%.o: zero1/%.cu $(HOST_HEADERS) $(CUDA_HEADERS) $(GPU_STAMP)
	$(check_mpi_flags)
	$(NVCC) $(NVCC_EXACT_FLAGS) $(NVCC_INCLUDES) $(MPI_NVCC_CFLAGS) -c $< -o $@
$(RUN_CUDA_OBJ): build/run/%.o: run/%.cu $(HOST_HEADERS) $(CUDA_HEADERS) $(GPU_STAMP)
	$(check_mpi_flags)
	@mkdir -p build/run
	$(NVCC) $(NVCC_EXACT_FLAGS) $(NVCC_INCLUDES) $(MPI_NVCC_CFLAGS) -c $< -o $@

# The CUDA device ops against zero1/device_cpu.c (built as the CPU trainer builds it: the
# reference bits are the CPU trainer's), and the NCCL communicator on one rank.
zero1/device_cpu_ref.o: zero1/device_cpu.c $(HOST_HEADERS)
	$(CC) $(CFLAGS) -c zero1/device_cpu.c -o $@

test_zero1_cuda: dev/test/test_zero1_cuda.cu zero1/device_cpu_ref.o zero1/trace.c $(ZERO1_CUDA_OBJ) $(HOST_HEADERS) $(CUDA_HEADERS) $(GPU_STAMP) $(RUN_CUDA_OBJ) $(RUN_LIB)
	$(check_mpi_flags)
	$(NVCC) $(NVCC_FLAGS) $(NVCC_INCLUDES) $(MPI_NVCC_CFLAGS) dev/test/test_zero1_cuda.cu zero1/device_cpu_ref.o zero1/trace.c $(ZERO1_CUDA_OBJ) -o $@ $(RUN_CUDA_OBJ) $(RUN_LIB) $(NVCC_LIBS)

# zero1/watchdog_cuda.h: the deadline of the GPU step's host sync (a stuck stream ends the job,
# a hazard-wrapped NCCL communicator is aborted through the wrapper).
test_watchdog_cuda: dev/test/test_watchdog_cuda.cu zero1/trace.c zero1/testing/comm_hazard.c $(ZERO1_CUDA_OBJ) $(HOST_HEADERS) $(CUDA_HEADERS) $(GPU_STAMP) $(RUN_CUDA_OBJ) $(RUN_LIB)
	$(check_mpi_flags)
	$(NVCC) $(NVCC_FLAGS) $(NVCC_INCLUDES) $(MPI_NVCC_CFLAGS) dev/test/test_watchdog_cuda.cu zero1/trace.c zero1/testing/comm_hazard.c $(ZERO1_CUDA_OBJ) -o $@ $(RUN_CUDA_OBJ) $(RUN_LIB) $(NVCC_LIBS)

# GPU 0's compute mode, for the GPU suite (rows whose ranks share a GPU need Default).
gpu_compute_mode: dev/test/gpu_compute_mode.cu $(CUDA_HEADERS) $(GPU_STAMP)
	$(NVCC) $(NVCC_FLAGS) $(NVCC_INCLUDES) dev/test/gpu_compute_mode.cu -o $@ $(NVCC_LIBS)

# Every CUDA kernel of llmc/ against plain C double references (dev/test/test_kernels_cuda.cu).
test_kernels_cuda: dev/test/test_kernels_cuda.cu $(HOST_HEADERS) $(CUDA_HEADERS) $(GPU_STAMP) $(RUN_LIB)
	$(check_mpi_flags)
	$(NVCC) $(NVCC_FLAGS) $(NVCC_INCLUDES) $(MPI_NVCC_CFLAGS) dev/test/test_kernels_cuda.cu -o $@ $(RUN_LIB) $(NVCC_LIBS)

test_gpt2cu: dev/test/test_gpt2.cu train_gpt2.cu $(TEST_HEADERS) $(CUDA_HEADERS) $(GPU_PLUGIN_SRC) $(PLUGIN_TEST_SRC) $(CUDNN_OBJ) $(GPU_STAMP) $(RUN_CUDA_OBJ) $(RUN_LIB)
	$(check_mpi_flags)
	$(check_cudnn)
	$(NVCC) $(NVCC_FLAGS) $(NVCC_INCLUDES) $(ZERO1_DEF) $(MPI_NVCC_CFLAGS) dev/test/test_gpt2.cu $(GPU_PLUGIN_SRC) $(PLUGIN_TEST_SRC) -o $@ \
	  $(CUDNN_LIBS) $(RUN_CUDA_OBJ) $(RUN_LIB) $(NVCC_LIBS)

# ---- the CPU execution layer for CUDA (cuda_cpu/) ----
# Its library and its own tests, built by its Makefile section (cuda_cpu/cuda_cpu.mk; on its
# own: make -C cuda_cpu), under the names the project gives them. -include: a copy of the
# sources without the layer still builds the CPU targets.
CUDA_CPU_DIR := cuda_cpu
CUDA_CPU_BUILD := build/cuda_cpu
CUDA_CPU_MPI_FLAGS = $(MPI_NVCC_CFLAGS) $(MPI_NVCC_LDFLAGS)
-include cuda_cpu/cuda_cpu.mk
CUDA_CPU_TEST_TARGETS = test_cuda_cpu_layer test_cuda_cpu_blas test_cuda_cpu_nccl test_cuda_cpu_tools \
  test_cuda_cpu_memcheck test_cuda_cpu_numerics
.PHONY: $(CUDA_CPU_TEST_TARGETS) bench_cuda_cpu
cuda_cpu: $(CUDA_CPU_A)
$(CUDA_CPU_TEST_TARGETS): test_cuda_cpu_%: $(CUDA_CPU_TB)/test_%
bench_cuda_cpu: $(CUDA_CPU_TB)/bench_layer

# ---- tasks ----
data: prepro_text
	./scripts/prepare_data.sh

test:
	./dev/test/run_tests.sh

# The fast tier (dev/test/run_tests.sh --fast: the scripts whose header line says tier=fast).
.PHONY: test-fast
test-fast:
	./dev/test/run_tests.sh --fast

test_gpu:
	./dev/test/run_gpu_tests.sh

bench:
	./scripts/bench.sh

demo:
	./scripts/demo.sh

clean:
	rm -rf build
	rm -f $(CPU_STAMP) $(GPU_STAMP) .build-cudnn.stamp train_gpt2 train_gpt2_plain train_gpt2_testing test_kernels test_zero1_runtime test_gpt2 test_zero1 prepro_text prepro_corpus zero1_plan gpt2_cost test_zero1_layout test_crc32c train_gpt2cu test_gpt2cu \
	  test_zero1_cuda test_watchdog_cuda test_kernels_cuda gpu_compute_mode \
	  $(ZERO1_CUDA_OBJ) zero1/device_cpu_ref.o test_zero1_devices test_mpi_wait bench_sgemm hf_convert
