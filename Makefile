# mixprec - GNU Make build, out of tree into build/ (build/san/ with SANITIZE=1).
#   make                 library (static + shared) and the CLI
#   make test            the test suite (installs missing Debian packages first)
#   make test SANITIZE=1 the same under AddressSanitizer + UBSan
#   make test-browser    the HTML report in headless Chromium (part of make test)
#   make test-exhaustive conversions checked on all 2^32 float32 inputs
#   make fuzz            libFuzzer on the loaders of outside data (FUZZ_SECONDS=60, mk/fuzz.mk)
#   make bench           every benchmark (convert, gemm, step, diag, checkpoint, conv, gpt)
#   make bench-diag      what --diagnostics 1 and 100 cost a training step
#   make bench-gpt       gpt_mini: tokens/s against Keras, attention kernel, generation
#   make bench-mpi       data parallel: 1 rank x 2 threads vs 2 ranks x 1, overlap, bytes
#   make bench-peers     the seed step next to Keras/TensorFlow and PyTorch, one run
#   make demo            the main job
#   make lm              a GPT-style model on English text (fortunes), float32 vs mixed_bfloat16
#   make install PREFIX=/usr/local
# WERROR=1 turns warnings into errors (CI sets it).
# MPI=1 builds data-parallel training on MPI (the default where mpicc is
# found), MPI=0 leaves it out (src/dist/ then answers MP_ERR_UNSUPPORTED).

CC       ?= cc
PREFIX   ?= /usr/local
SANITIZE ?= 0
WERROR   ?= 0

ifeq ($(SANITIZE),1)
BUILD    ?= build/san
OPT      := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
LDSAN    := -fsanitize=address,undefined
else
BUILD    ?= build
OPT      := -O2 -g
LDSAN    :=
endif

WARN     := -Wall -Wextra -Wpedantic -Wshadow -Wstrict-prototypes -Wmissing-prototypes
ifeq ($(WERROR),1)
WARN     += -Werror
endif
# No -ffast-math, ever: loss scaling depends on inf/NaN checks surviving.
CFLAGS_ALL := -std=c11 -D_DEFAULT_SOURCE $(OPT) $(WARN) -fopenmp -fPIC -Iinclude -Isrc $(CFLAGS)
LDLIBS_ALL := -fopenmp -ljansson -lz -lm $(LDSAN) $(LDFLAGS)

# MPI: only src/dist/dist_mpi.c and reducer_mpi.c see MPI's headers; everything that links the
# library links MPI's libraries (mpicc --showme:link).
MPI ?= $(shell command -v mpicc >/dev/null 2>&1 && echo 1 || echo 0)
ifeq ($(MPI),1)
ifeq ($(shell command -v mpicc 2>/dev/null),)
$(error MPI=1 but mpicc is not installed: sh scripts/deps.sh mpi (libopenmpi-dev openmpi-bin))
endif
DIST_SRC := src/dist/common.c src/dist/dist_mpi.c src/dist/reducer_mpi.c
MPI_CFLAGS := $(shell mpicc --showme:compile)
MPI_LIBS := $(shell mpicc --showme:link)
else
DIST_SRC := src/dist/common.c src/dist/dist_stub.c
MPI_CFLAGS :=
MPI_LIBS :=
endif
LDLIBS_ALL += $(MPI_LIBS)
# The library is relinked when MPI is switched on or off in the same build/.
MPI_STAMP := $(BUILD)/.mpi
$(shell mkdir -p $(BUILD); [ "$$(cat $(MPI_STAMP) 2>/dev/null)" = "$(MPI)" ] || echo $(MPI) > $(MPI_STAMP))

LIB_SRC  := $(wildcard src/core/*.c src/kernels/*.c src/nn/*.c src/nn/layers/*.c src/optim/*.c src/io/*.c src/train/*.c) $(DIST_SRC)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CLI_SRC  := $(wildcard src/cli/*.c)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TEST_COMMON := $(BUILD)/obj/tests/common.o

STATIC   := $(BUILD)/libmixprec.a
SHARED   := $(BUILD)/libmixprec.so
CLI      := $(BUILD)/mixprec

.PHONY: ref-venv resnet bench-peers bench-mpi lm test-mpi test-browser bench-diag deps-build bench-step bench-checkpoint bench-conv bench-gpt keras-venv examples test-install all test test-exhaustive bench bench-convert bench-gemm bench-deps demo install clean deps-test format
.DEFAULT_GOAL := all

all: $(STATIC) $(SHARED) $(CLI)

# Every object waits for the build packages (order-only: never a rebuild), so
# plain `make` on a fresh machine says what to install instead of failing
# on a missing header.
deps-build:
	@sh scripts/deps.sh build

$(LIB_OBJ) $(CLI_OBJ) $(TEST_COMMON): | deps-build

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(BUILD)/obj/src/dist/dist_mpi.o $(BUILD)/obj/src/dist/reducer_mpi.o: CFLAGS_ALL += $(MPI_CFLAGS)

$(STATIC): $(LIB_OBJ) $(MPI_STAMP)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $(LIB_OBJ)

# The soname's link next to the library, so a program linked against build/
# starts with LD_LIBRARY_PATH=build.
$(SHARED): $(LIB_OBJ) $(MPI_STAMP)
	$(CC) -shared -Wl,-soname,libmixprec.so.0 -o $@ $(LIB_OBJ) $(LDLIBS_ALL)
	ln -sf libmixprec.so $(BUILD)/libmixprec.so.0

$(CLI): $(CLI_OBJ) $(STATIC)
	$(CC) -o $@ $(CLI_OBJ) $(STATIC) $(LDLIBS_ALL)

# ------------------------------------------------------------------ tests
deps-test:
	@sh scripts/deps.sh test

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(TEST_COMMON) $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $< $(TEST_COMMON) $(STATIC) -lcmocka $(LDLIBS_ALL)

# test_mx hands the shared library to tests/interop/mx_ml_dtypes.py: keep it current.
$(BUILD)/tests/test_mx: $(SHARED)

test: deps-test
	@$(MAKE) --no-print-directory $(TEST_BIN) $(CLI) $(EXAMPLES)
	@sh tests/headers_test.sh
	@sh tests/run.sh $(BUILD) $(TEST_BIN)
	@$(MAKE) --no-print-directory test-mpi
	@$(MAKE) --no-print-directory test-browser

# Data parallel through mpirun (2 ranks on this machine); skipped, saying so,
# in a build without MPI.
ifeq ($(MPI),1)
$(BUILD)/tests/dist_test: $(BUILD)/obj/tests/dist_test.o $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $< $(STATIC) $(LDLIBS_ALL)

test-mpi: $(BUILD)/tests/dist_test $(CLI)
	@sh tests/dist_test.sh $(BUILD)
else
test-mpi:
	@echo "test-mpi: skipped (this build has no MPI: sh scripts/deps.sh mpi, then make MPI=1 test)"
endif

# The report in headless Chromium (tests/browser_test.sh, ~10 s): installs
# chromium and the Fashion-MNIST files first; where they cannot be installed
# it says that the browser test did not run, and make test still passes.
test-browser: $(CLI)
	@if sh scripts/deps.sh browser && sh scripts/deps.sh data; then \
	  sh tests/browser_test.sh $(BUILD); \
	else \
	  echo "test-browser: the browser test did NOT run (chromium or dataset-fashion-mnist could not be installed: as root, sh scripts/deps.sh browser; sh scripts/deps.sh data)"; \
	fi

$(BUILD)/exhaustive: $(BUILD)/obj/tests/exhaustive.o $(STATIC)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

test-exhaustive: $(BUILD)/exhaustive
	$(BUILD)/exhaustive

# -------------------------------------------------------------- benchmarks
bench: bench-convert bench-gemm bench-step bench-diag bench-checkpoint bench-conv bench-gpt

$(BUILD)/bench_convert: $(BUILD)/obj/bench/bench_convert.o $(STATIC)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

bench-convert: $(BUILD)/bench_convert
	$(BUILD)/bench_convert

bench-deps:
	@sh scripts/deps.sh bench

# Peers are loaded with dlopen at run time when installed; OpenBLAS runs with
# the fastest core type bench_gemm finds for this CPU (its own choice or an
# AVX-512 OPENBLAS_CORETYPE, each tried in a child process; it says which).
# bench_gemm.o sees <dnnl.h> (types only) when it is there: the stamp holds
# the peer headers present, so installing or removing one rebuilds it.
PEER_HEADERS := $(wildcard /usr/include/dnnl.h /usr/include/dnnl_types.h)
PEER_STAMP := $(BUILD)/.peer-headers
$(shell mkdir -p $(BUILD); [ -f $(PEER_STAMP) ] && [ "$$(cat $(PEER_STAMP))" = "$(PEER_HEADERS)" ] || echo "$(PEER_HEADERS)" > $(PEER_STAMP))
$(BUILD)/obj/bench/bench_gemm.o: $(PEER_STAMP) $(PEER_HEADERS)

$(BUILD)/bench_gemm: $(BUILD)/obj/bench/bench_gemm.o $(STATIC)
	$(CC) -o $@ $^ $(LDLIBS_ALL) -ldl

bench-gemm: $(BUILD)/bench_gemm
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(BUILD)/bench_gemm

# --------------------------------------------------------------- examples
EXAMPLE_SRC := $(wildcard examples/*.c)
EXAMPLES    := $(EXAMPLE_SRC:examples/%.c=$(BUILD)/examples/%)

$(BUILD)/examples/%: $(BUILD)/obj/examples/%.o $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $< $(STATIC) $(LDLIBS_ALL)

examples: $(EXAMPLES)

$(BUILD)/bench_step: $(BUILD)/obj/bench/bench_step.o $(STATIC)
	$(CC) -o $@ $^ $(LDLIBS_ALL) -ldl

# PyTorch's step is measured in the same run when python3-torch is installed
# (OpenBLAS, which it calls for float32 products, at its best core type as in
# bench-gemm); then where the step's time goes, per phase and policy.
bench-step: $(BUILD)/bench_step
	$(BUILD)/bench_step

$(BUILD)/bench_diag: $(BUILD)/obj/bench/bench_diag.o $(STATIC)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

# What --diagnostics 1 and 100 cost a step of the seed MLP (batch 256,
# mixed_bfloat16; BENCH_DIAG_ARGS="--policy P --batch N --steps N"), ~1 min.
bench-diag: $(BUILD)/bench_diag
	$(BUILD)/bench_diag $(BENCH_DIAG_ARGS)

$(BUILD)/bench_checkpoint: $(BUILD)/obj/bench/bench_checkpoint.o $(STATIC)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

bench-checkpoint: $(BUILD)/bench_checkpoint
	$(BUILD)/bench_checkpoint

$(BUILD)/bench_conv: $(BUILD)/obj/bench/bench_conv.o $(STATIC)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

$(BUILD)/bench_mpi: $(BUILD)/obj/bench/bench_mpi.o $(STATIC)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

# Data parallel on this machine: 1 rank x 2 threads against 2 ranks x 1
# thread, the overlap, the bytes (--bind-to none: rank 0 also runs alone on
# two threads).
ifeq ($(MPI),1)
bench-mpi: $(BUILD)/bench_mpi
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
	    mpirun --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 $(BUILD)/bench_mpi
else
bench-mpi:
	@echo "bench-mpi: this build has no MPI (sh scripts/deps.sh mpi, then make MPI=1)"; exit 1
endif

# $(call pip_venv,DIR,PACKAGES,WHAT): a virtual environment DIR with
# PACKAGES from PyPI, made once (DIR/.installed); if that fails (no network,
# no python3-venv) DIR is removed and the message says WHAT follows.
define pip_venv
	@if [ ! -f $(1)/.installed ]; then \
	  echo "mixprec: installing $(2) from PyPI into $(1) (python3 -m venv; pip install $(2))"; \
	  rm -rf $(1); mkdir -p build; \
	  if python3 -m venv $(1) >$(1).log 2>&1 && \
	     $(1)/bin/pip install -q --retries 2 $(2) >>$(1).log 2>&1; then \
	    touch $(1)/.installed; \
	  else rm -rf $(1); \
	    echo "mixprec: could not install $(2) ($(1).log): $(3)"; fi; \
	fi
endef

# Keras 3 on TensorFlow runs the same model in the same run (bench-conv:
# ResNet-20, bench-gpt: gpt_mini), from a virtual environment under build/
# made on first use (python3 -m venv, then pip install tensorflow-cpu keras
# from PyPI; never needed by make test). If that fails (no network, no
# python3-venv) the Keras columns say n/a.
KERAS_VENV := build/venv-keras
keras-venv:
	$(call pip_venv,$(KERAS_VENV),tensorflow-cpu keras,Keras will be n/a)

# ml_dtypes (PyPI) as an independent reference for the MX/fp8/fp6/fp4 casts:
# tests/interop/mx_ml_dtypes.py runs under make test when build/venv-ref (or
# the Keras environment above, which has it too) holds it; .ci/run makes it.
# Without network the test is skipped, saying so.
REF_VENV := build/venv-ref
ref-venv:
	$(call pip_venv,$(REF_VENV),ml_dtypes numpy,its test will be skipped)

# The seed step in float32 and mixed_bfloat16 next to Keras 3/TensorFlow
# (bench/step_keras.py, from the virtual environment above) and PyTorch from
# Debian (bench/step_torch.py, apt-get install -y python3-torch), ratios of
# the one run; a missing peer is reported as missing (~3 minutes).
bench-peers: $(BUILD)/bench_step keras-venv
	$(BUILD)/bench_step --peers --keras-python $(KERAS_VENV)/bin/python

bench-conv: $(BUILD)/bench_conv keras-venv
	$(BUILD)/bench_conv --keras-python $(KERAS_VENV)/bin/python

$(BUILD)/bench_gpt: $(BUILD)/obj/bench/bench_gpt.o $(STATIC)
	$(CC) -o $@ $^ $(LDLIBS_ALL)

# The attention kernel against the plain formula, gpt_mini's training
# tokens/s per policy against Keras (intra- and inter-op threads = ours),
# and generation with and without the key/value cache (a few minutes on two
# cores). BENCH_GPT_ARGS, e.g. "--steps 3 --gen-tokens 4", for a quick run.
bench-gpt: $(BUILD)/bench_gpt keras-venv
	$(BUILD)/bench_gpt --keras-python $(KERAS_VENV)/bin/python $(BENCH_GPT_ARGS)

# --------------------------------------------------------- language model
# gpt_mini on Debian's fortunes under float32 and mixed_bfloat16, their
# validation curves side by side and a generated sample (LM_STEPS, LM_EVERY,
# LM_BATCH change the run; about 20 minutes on two cores with the defaults).
lm:
	@sh scripts/deps.sh build
	@sh scripts/deps.sh text
	@$(MAKE) --no-print-directory $(CLI)
	sh scripts/lm_demo.sh $(BUILD)

# ------------------------------------------------------------------- demo
# The main job: the seed MLP on Fashion-MNIST under float32, mixed_bfloat16
# and mixed_float16, one comparison table (a few minutes on two cores).
demo:
	@sh scripts/deps.sh build
	@sh scripts/deps.sh data
	@$(MAKE) --no-print-directory $(CLI)
	$(CLI) demo --run-dir $(BUILD)/demo $(DEMO_ARGS)

# ResNet-20 (with RandomFlip and RandomTranslation) on Fashion-MNIST, 10
# epochs of AdamW (lr 2e-3, weight decay 0.05, 200 warm-up steps, cosine
# decay) under the three policies: test accuracy, time per epoch, peak
# memory and the largest batch that fits 2 GiB (about 35 minutes on two
# AVX-512 cores, 90 on two AVX2 cores).
resnet:
	@sh scripts/deps.sh build
	@sh scripts/deps.sh data
	@$(MAKE) --no-print-directory $(CLI)
	$(CLI) demo --model examples/resnet20_augment.json --epochs 10 --batch-size 128 \
	    --optimizer adamw --lr 2e-3 --weight-decay 0.05 --warmup-steps 200 \
	    --lr-decay cosine --run-dir $(BUILD)/resnet $(RESNET_ARGS)

# ---------------------------------------------------------------- install
install: $(STATIC) $(SHARED) $(CLI)
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -d $(DESTDIR)$(PREFIX)/include/mixprec
	install -m 644 include/mixprec.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 include/mixprec/*.h $(DESTDIR)$(PREFIX)/include/mixprec/
	install -m 644 $(STATIC) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(SHARED) $(DESTDIR)$(PREFIX)/lib/libmixprec.so.0
	ln -sf libmixprec.so.0 $(DESTDIR)$(PREFIX)/lib/libmixprec.so
	install -m 755 $(CLI) $(DESTDIR)$(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@MPI_LIBS@|$(MPI_LIBS)|' -e 's|@VERSION@|$(shell sed -n 's/.*MP_VERSION_STRING "\(.*\)"/\1/p' include/mixprec.h)|' \
		mixprec.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/mixprec.pc

# Install into a scratch prefix and build a program against it with pkg-config.
test-install: all
	@sh scripts/deps.sh pkgconfig
	@sh tests/install_test.sh

format:
	clang-format -i $(LIB_SRC) $(CLI_SRC) $(wildcard src/*/*.h tests/*.c tests/*.h bench/*.c include/*.h include/mixprec/*.h fuzz/*.c)

clean:
	rm -rf build

# ------------------------------------------------------------------- fuzz
include mk/fuzz.mk

-include $(shell find build -name '*.d' 2>/dev/null)
