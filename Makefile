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
#   make ... TEST_SEAMS=1             a test build: dev/test/seams.c linked in (make test's; docs/testing.md)
# Other toolchains: MPICC=mpicc.mpich (any MPI's compiler wrapper: Open MPI 4/5, MPICH),
# CUDA_HOME=/opt/cuda (nvcc, headers, libraries; NVCC=... overrides nvcc alone),
# NCCL_HOME=/opt/nccl (include/ and lib/ of an NCCL outside the CUDA toolkit), CUDNN_HOME likewise for cuDNN.
#
# Every program is named once, in a table below; `make clean` takes them from there, and
# .gitignore ignores every file at the top of the tree without a dot in its name. Sources
# compile one object each into build/ with the compiler's -MMD dependency files, so a header
# change rebuilds exactly what includes it.

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
# memcheck at the MPI boundary (cuda_cpu/mpi_check.c: compiled against MPI's own mpi.h, so here).
CUDA_CPU_MPI_CHECK := build/gpu/cuda_cpu/mpi_check.o
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

# run/: the library that owns a run (its configuration, output directory, checkpoints, data,
# logs, deadlines and evals), compiled by $(MPICC), whose MPI its collectives are written
# against, into build/run/librun.a; every program links it (llmc/ and zero1/ call its fatal()).
RUN_LIB = build/run/librun.a
RUN_OBJ = $(patsubst %.c,build/%.o,$(wildcard run/*.c))
# run/'s one CUDA file, the NCCL bootstrap and check of the GPU trainer and of zero1/'s NCCL
# communicator: an object of every GPU build.
RUN_CUDA_OBJ = build/gpu/run/nccl_comm.o

ZERO1_CORE_SRC = zero1/layout.c zero1/layout_layerwise.c zero1/shards.c
ZERO1_RUNTIME_SRC = zero1/runtime.c zero1/checkpoint.c zero1/optimizer.c zero1/comm_mpi.c zero1/comm_single.c \
  zero1/device_cpu.c zero1/trace.c zero1/trace_clock.c zero1/split_embedding.c
# The test doubles (the deferred device, the hazard communicator): test binaries only.
ZERO1_TEST_SRC = zero1/testing/device_deferred.c zero1/testing/comm_hazard.c
ZERO1_CPU_SRC = $(ZERO1_CORE_SRC) $(ZERO1_RUNTIME_SRC) zero1/backend_cpu.c zero1/device_cpu_muon.c
# The GPU build's: compiled by nvcc with the trainer's flags, but the CUDA device ops and the
# NCCL communicator with exact ones (below).
ZERO1_GPU_SRC = $(ZERO1_CORE_SRC) $(ZERO1_RUNTIME_SRC) zero1/backend_cuda.cu
ZERO1_CUDA_SRC = zero1/device_cuda.cu zero1/device_cuda_muon.cu zero1/comm_nccl.cu
ifeq ($(USE_ZERO1),1)
CPU_PLUGIN_SRC = $(ZERO1_CPU_SRC)
GPU_PLUGIN_SRC = $(ZERO1_GPU_SRC) $(ZERO1_CUDA_SRC)
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

# TEST_SEAMS=1: a test build. Its programs link dev/test/seams.c, which acts at run/seams.h's
# seams (stop points, planted faults: docs/testing.md); the product's programs do not. The
# programs under dev/ (tests, benchmarks) always do.
TEST_SEAMS ?= 0
SEAMS_OBJ = build/dev/test/seams.o
PRODUCT_SEAMS = $(if $(filter 1,$(TEST_SEAMS)),$(SEAMS_OBJ))

# The binaries' names do not say how they were built, so the build variables are kept in
# stamp files that change only when the variables do: switching USE_ZERO1 or PRECISION
# rebuilds, repeating a build does not.
# The toolchain counts too: a binary linked against another MPI must not survive a switch.
# A stamp is a target, rewritten only when a goal depends on it and its variables changed
# (stamp_stale makes it depend on .stamp-stale then): `make data` leaves the trainer's alone.
stamp_stale = $(shell echo "$(2)" | cmp -s - $(1) || echo .stamp-stale)
CPU_STAMP := .build-cpu.stamp
GPU_STAMP := .build-gpu.stamp
RUN_STAMP := .build-run.stamp
SEAMS_STAMP := .build-seams.stamp
CPU_BUILD := USE_ZERO1=$(USE_ZERO1) CC=$(shell command -v $(CC) 2>/dev/null || echo $(CC))
GPU_BUILD := CUDA_ON_CPU=$(CUDA_ON_CPU) CUDA_CPU_TOOLS=$(CUDA_CPU_TOOLS) CUDA_CPU_NUMERICS=$(CUDA_CPU_NUMERICS) USE_ZERO1=$(USE_ZERO1) USE_CUDNN=$(USE_CUDNN) PRECISION=$(PRECISION) GPU_ARCH=$(GPU_ARCH) NVCC=$(NVCC) NCCL_HOME=$(NCCL_HOME) \
             MPICC=$(shell command -v $(MPICC) 2>/dev/null || echo $(MPICC))
RUN_BUILD := MPICC=$(shell command -v $(MPICC) 2>/dev/null || echo $(MPICC)) CFLAGS=$(CFLAGS)
SEAMS_BUILD := TEST_SEAMS=$(TEST_SEAMS)
# (Rules, but never the default goal: their names start with a dot.)
.PHONY: .stamp-stale
.stamp-stale:
$(CPU_STAMP): $(call stamp_stale,$(CPU_STAMP),$(CPU_BUILD))
	@echo "$(CPU_BUILD)" > $@
$(GPU_STAMP): $(call stamp_stale,$(GPU_STAMP),$(GPU_BUILD))
	@echo "$(GPU_BUILD)" > $@
$(RUN_STAMP): $(call stamp_stale,$(RUN_STAMP),$(RUN_BUILD))
	@echo "$(RUN_BUILD)" > $@
$(SEAMS_STAMP): $(call stamp_stale,$(SEAMS_STAMP),$(SEAMS_BUILD))
	@echo "$(SEAMS_BUILD)" > $@

# ---- objects: one per source, with its -MMD dependency file beside it ----
# build/run/, build/dev/test/seams.o: by $(MPICC). build/cpu/: a CPU program's own sources, by
# $(CC) (build/plain/: train_gpt2.c without the plugin). build/host/: the tools' and the
# MPI-free programs', by gcc, so that building them never touches a trainer's stamp.
# build/gpu/: the GPU programs', by $(NVCC). DEFS: an object's own defines (below).
DEPFLAGS = -MMD -MP
build/run/%.o: run/%.c $(RUN_STAMP)
	@mkdir -p $(@D)
	$(MPICC) $(CFLAGS) $(DEPFLAGS) -c $< -o $@
$(SEAMS_OBJ): dev/test/seams.c $(RUN_STAMP)
	@mkdir -p $(@D)
	$(MPICC) $(CFLAGS) $(DEPFLAGS) -c $< -o $@
$(RUN_LIB): $(RUN_OBJ)
	rm -f $@ && ar rcs $@ $^
build/cpu/%.o: %.c $(CPU_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(DEFS) $(DEPFLAGS) -c $< -o $@
build/plain/train_gpt2.o: train_gpt2.c $(CPU_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(DEFS) $(DEPFLAGS) -c $< -o $@
build/host/%.o: %.c
	@mkdir -p $(@D)
	gcc $(CFLAGS) $(DEPFLAGS) -c $< -o $@
build/cpu/train_gpt2.o: DEFS = $(ZERO1_DEF) $(CPU_REBUILD)
build/plain/train_gpt2.o: DEFS = $(CPU_REBUILD)
build/cpu/dev/test/test_gpt2.o: DEFS = $(ZERO1_DEF)
build/cpu/dev/test/test_zero1.o build/cpu/dev/test/train_gpt2_testing.o: DEFS = -DUSE_ZERO1
-include $(shell find build -name '*.d' 2>/dev/null)

cpu = $(patsubst %.c,build/cpu/%.o,$(1))
host = $(patsubst %.c,build/host/%.o,$(1))

# ---- the CPU programs ----
# $(call cpu_program,NAME,OBJECTS,LIBS[,SEAMS]): linked by $(CC) with run/'s library; SEAMS:
# dev/test/seams.c always (the programs under dev/), else only in a test build.
define cpu_program
PROGRAMS += $(1)
$(1): $(2) $$(RUN_LIB) $(or $(4),$$(PRODUCT_SEAMS) $$(SEAMS_STAMP))
	$$(CC) $$(CFLAGS) $(2) $(or $(4),$$(PRODUCT_SEAMS)) -o $$@ $$(RUN_LIB) $(3)
endef
# $(call host_program,NAME,OBJECTS,LIBS[,SEAMS]): the same, linked by gcc.
define host_program
PROGRAMS += $(1)
$(1): $(2) $$(RUN_LIB) $(or $(4),$$(PRODUCT_SEAMS) $$(SEAMS_STAMP))
	gcc $$(CFLAGS) $(2) $(or $(4),$$(PRODUCT_SEAMS)) -o $$@ $$(RUN_LIB) $(3)
endef
BLAS = -lopenblas -lm

# The trainers, and the one without the plugin under its own name, so tests can run both builds.
$(eval $(call cpu_program,train_gpt2,build/cpu/train_gpt2.o $(call cpu,$(CPU_PLUGIN_SRC)),$(BLAS)))
$(eval $(call cpu_program,train_gpt2_plain,build/plain/train_gpt2.o,$(BLAS),$(SEAMS_OBJ)))
# Data preparation: text -> llm.c token shards + tokenizer file, with GPT-2's BPE; JSONL
# (plain, zstd, gzip) and text corpora -> shards on every core (Debian's libjansson-dev,
# libzstd-dev, zlib1g-dev: scripts/install_deps.sh); llm.c model files and checkpoints <->
# Hugging Face GPT-2 (model.safetensors + config.json).
$(eval $(call host_program,prepro_text,build/host/tools/prepro_text.o,-lm))
$(eval $(call host_program,prepro_corpus,build/host/tools/prepro_corpus.o,-pthread -ljansson -lzstd -lz -lm))
$(eval $(call host_program,hf_convert,build/host/tools/hf_convert.o,-lm))
# The ZeRO-1 layout planner; the cost model: a FLOP and byte count of the GPU step, its
# roofline time (dev/cost/cost_model.h).
$(eval $(call host_program,zero1_plan,$(call host,zero1/zero1_plan.c zero1/plan_muon.c $(ZERO1_CORE_SRC)),-lm))
$(eval $(call host_program,gpt2_cost,$(call host,dev/cost/gpt2_cost.c $(ZERO1_CORE_SRC)),-lm))

# The tests (dev/test/testing_options.h: the options only they have, the test doubles).
# The oracle harness and ZeRO-1 against replicated, step by step, include a trainer; the
# CPU trainer with the test options runs on the test doubles.
$(eval $(call cpu_program,test_gpt2,$(call cpu,dev/test/test_gpt2.c $(CPU_PLUGIN_SRC) $(PLUGIN_TEST_SRC)),$(BLAS),$(SEAMS_OBJ)))
$(eval $(call cpu_program,test_zero1,$(call cpu,dev/test/test_zero1.c $(ZERO1_CPU_SRC) $(ZERO1_TEST_SRC)),$(BLAS),$(SEAMS_OBJ)))
$(eval $(call cpu_program,train_gpt2_testing,$(call cpu,dev/test/train_gpt2_testing.c $(ZERO1_CPU_SRC) $(ZERO1_TEST_SRC)),$(BLAS),$(SEAMS_OBJ)))
# The test device and communicator (deferred, hazard) against their contracts (MPI for
# `mpirun -np N ./test_zero1_devices --mpi`); run/mpi_wait.h's collectives under --comm-timeout.
$(eval $(call cpu_program,test_zero1_devices,$(call cpu,dev/test/test_zero1_devices.c $(ZERO1_TEST_SRC) zero1/device_cpu.c zero1/comm_single.c zero1/comm_mpi.c),-lm,$(SEAMS_OBJ)))
$(eval $(call cpu_program,test_mpi_wait,build/cpu/dev/test/test_mpi_wait.o,-lm,$(SEAMS_OBJ)))
# No MPI: the zero1 runtime alone (one rank) against dense AdamW; the zero1 core; the CPU
# kernels against double references; run/crc32c.h; OpenBLAS sgemm GFLOP/s (make bench).
$(eval $(call host_program,test_zero1_runtime,$(call host,dev/test/test_zero1_runtime.c $(ZERO1_CORE_SRC) zero1/runtime.c zero1/split_embedding.c zero1/checkpoint.c zero1/comm_single.c zero1/device_cpu.c zero1/trace.c $(ZERO1_TEST_SRC)),-lm,$(SEAMS_OBJ)))
$(eval $(call host_program,test_zero1_layout,$(call host,dev/test/test_zero1_layout.c $(ZERO1_CORE_SRC)),-lm,$(SEAMS_OBJ)))
$(eval $(call host_program,test_kernels,build/host/dev/test/test_kernels.o,$(BLAS),$(SEAMS_OBJ)))
$(eval $(call host_program,test_crc32c,build/host/dev/test/test_crc32c.o,-lm,$(SEAMS_OBJ)))
$(eval $(call host_program,bench_sgemm,build/host/dev/test/bench_sgemm.o,$(BLAS),$(SEAMS_OBJ)))

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
build/cudnn_attention.o: llmc/cudnn_attention.cpp $(CUDNN_STAMP)
	$(check_cudnn)
	@mkdir -p build
	$(NVCC) -std=c++17 -O1 -DENABLE_BF16 -DUSE_CUDNN -DCUDNN_FRONTEND_SKIP_JSON_LIB -I. -I$(CUDNN_FRONTEND_PATH) \
	  $(if $(filter $(CUDA_HOME),$(CUDNN_HOME)),,-I$(CUDNN_HOME)/include) $(NVCC_INCLUDES) $(DEPFLAGS) -c $< -o $@
# `make cudnn_check USE_CUDNN=1`: succeeds when every piece is there (scripts/check_cuda_build.sh).
.PHONY: cudnn_check
cudnn_check:
	$(check_cudnn)
	@echo "cuDNN: frontend $(CUDNN_FRONTEND_PATH), library $(CUDNN_LIB)"
endif


# ---- the GPU objects and programs ----
# zero1's CUDA backend must give zero1/device_cpu.c's bits (AdamW, bf16 rounding, norm):
# the trainer's flags, but IEEE division and square root and no flushed denormals (no
# --use_fast_math), and no fused multiply-adds (the CPU build, ISO C, fuses none).
NVCC_EXACT_FLAGS = $(filter-out --use_fast_math,$(NVCC_FLAGS)) -fmad=false
GPU_FLAGS = $(NVCC_FLAGS)
$(patsubst %.cu,build/gpu/%.o,$(ZERO1_CUDA_SRC)) $(RUN_CUDA_OBJ): GPU_FLAGS = $(NVCC_EXACT_FLAGS)
build/gpu/train_gpt2.o: DEFS = $(ZERO1_DEF) $(GPU_REBUILD)
build/gpu/dev/test/test_gpt2.o: DEFS = $(ZERO1_DEF)
build/gpu/%.o: %.cu $(GPU_STAMP)
	$(check_mpi_flags)
	@mkdir -p $(@D)
	$(NVCC) $(GPU_FLAGS) $(NVCC_INCLUDES) $(MPI_NVCC_CFLAGS) $(DEFS) $(DEPFLAGS) -c $< -o $@
build/gpu/%.o: %.c $(GPU_STAMP)
	$(check_mpi_flags)
	@mkdir -p $(@D)
	$(NVCC) $(GPU_FLAGS) $(NVCC_INCLUDES) $(MPI_NVCC_CFLAGS) $(DEPFLAGS) -c $< -o $@

gpu = $(patsubst %,build/gpu/%.o,$(basename $(1)))

# $(call gpu_program,NAME,OBJECTS[,SEAMS[,cudnn]]): linked by $(NVCC) with run/'s library, the
# CUDA libraries (the CPU layer's on CUDA_ON_CPU=1) and MPI; SEAMS as for the CPU programs;
# cudnn: with cuDNN's attention in a USE_CUDNN=1 build.
define gpu_program
PROGRAMS += $(1)
$(1): $(2) $(if $(4),$$(CUDNN_OBJ)) $$(RUN_LIB) $$(CUDA_CPU_LIB) $$(CUDA_CPU_MPI_CHECK) $(or $(3),$$(PRODUCT_SEAMS) $$(SEAMS_STAMP))
	$$(check_mpi_flags)
	$$(NVCC) $$(NVCC_FLAGS) $(2) $$(CUDA_CPU_MPI_CHECK) $(or $(3),$$(PRODUCT_SEAMS)) -o $$@ $(if $(4),$$(CUDNN_LIBS)) $$(RUN_LIB) $$(NVCC_LIBS)
endef

$(eval $(call gpu_program,train_gpt2cu,$(call gpu,train_gpt2.cu $(GPU_PLUGIN_SRC)) $(RUN_CUDA_OBJ),,cudnn))
# Every CUDA kernel of llmc/ against plain C double references; the oracle harness.
$(eval $(call gpu_program,test_kernels_cuda,$(call gpu,dev/test/test_kernels_cuda.cu),$(SEAMS_OBJ)))
$(eval $(call gpu_program,test_gpt2cu,$(call gpu,dev/test/test_gpt2.cu $(GPU_PLUGIN_SRC) $(PLUGIN_TEST_SRC)) $(RUN_CUDA_OBJ),$(SEAMS_OBJ),cudnn))
# The CUDA device ops against zero1/device_cpu.c (built as the CPU trainer builds it: the
# reference bits are the CPU trainer's), and the NCCL communicator on one rank.
# Its muon check needs the CPU device's muon op (zero1/device_cpu_muon.c: OpenBLAS): linked in
# CUDA_ON_CPU=1 builds only (the layer's machines have OpenBLAS; a GPU machine need not, and
# there the check says SKIP).
ZERO1_CUDA_TEST_MUON = $(if $(filter 1,$(CUDA_ON_CPU)),build/cpu/zero1/device_cpu_muon.o)
test_zero1_cuda: NVCC_LIBS += $(if $(filter 1,$(CUDA_ON_CPU)),-lopenblas)
$(eval $(call gpu_program,test_zero1_cuda,$(call gpu,dev/test/test_zero1_cuda.cu zero1/trace.c $(ZERO1_CUDA_SRC)) build/cpu/zero1/device_cpu.o $(ZERO1_CUDA_TEST_MUON) $(RUN_CUDA_OBJ),$(SEAMS_OBJ)))
# zero1/watchdog_cuda.h: the deadline of the GPU step's host sync (a stuck stream ends the job,
# a hazard-wrapped NCCL communicator is aborted through the wrapper).
$(eval $(call gpu_program,test_watchdog_cuda,$(call gpu,dev/test/test_watchdog_cuda.cu zero1/trace.c zero1/testing/comm_hazard.c $(ZERO1_CUDA_SRC)) $(RUN_CUDA_OBJ),$(SEAMS_OBJ)))
# GPU 0's compute mode, for the GPU suite (rows whose ranks share a GPU need Default).
$(eval $(call gpu_program,gpu_compute_mode,build/gpu/dev/test/gpu_compute_mode.o,$(SEAMS_OBJ)))

# ---- the CPU execution layer for CUDA (cuda_cpu/) ----
# Its library and its own tests, built by its Makefile section (cuda_cpu/cuda_cpu.mk; on its
# own: make -C cuda_cpu), under the names the project gives them. -include: a copy of the
# sources without the layer still builds the CPU targets.
CUDA_CPU_DIR := cuda_cpu
CUDA_CPU_BUILD := build/cuda_cpu
CUDA_CPU_MPI_FLAGS = $(MPI_NVCC_CFLAGS) $(MPI_NVCC_LDFLAGS)
-include cuda_cpu/cuda_cpu.mk
CUDA_CPU_TEST_TARGETS = test_cuda_cpu_layer test_cuda_cpu_blas test_cuda_cpu_nccl test_cuda_cpu_tools \
  test_cuda_cpu_memcheck test_cuda_cpu_numerics test_cuda_cpu_boundary test_cuda_cpu_tensorcore
.PHONY: $(CUDA_CPU_TEST_TARGETS) bench_cuda_cpu
cuda_cpu: $(CUDA_CPU_A)
$(CUDA_CPU_TEST_TARGETS): test_cuda_cpu_%: $(CUDA_CPU_TB)/test_%
bench_cuda_cpu: $(CUDA_CPU_TB)/bench_layer

# ---- tasks ----
.PHONY: all test test-fast test_gpu bench demo clean data cuda_cpu
all: train_gpt2 zero1_plan gpt2_cost prepro_text prepro_corpus hf_convert

data: prepro_text
	./scripts/prepare_data.sh

test:
	./dev/test/run_tests.sh

# The fast tier (dev/test/run_tests.sh --fast: the scripts whose header line says tier=fast).
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
	rm -f .build-*.stamp $(PROGRAMS)
