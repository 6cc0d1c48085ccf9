# mk/fuzz.mk - the loaders of outside data under libFuzzer. Included by the
# Makefile after it defines LIB_SRC, BUILD, CC, LDLIBS_ALL, TEST_COMMON and
# STATIC (rule targets and prerequisites use them as they are read), e.g. at
# its end. One target per loader, fuzz/fuzz_<target>.c:
#   checkpoint  safetensors checkpoints and model configurations
#               (seeds: tests/fuzz/corpus, tests/fuzz/regress)
#   dataset     the CSV, IDX (plain and gzip) and text dataset loaders
#               (tests/fuzz/dataset)
#   cache       the kernel-choice cache files (tests/fuzz/cache)
#   report      the run directory `mixprec report` reads, and the page it
#               makes (tests/fuzz/report; links the report's CLI objects)
#   make fuzz [FUZZ_SECONDS=60]  build build/fuzz/fuzz_<target> with clang
#                                (libFuzzer + AddressSanitizer + UBSan, every
#                                library source compiled with the instrumentation)
#                                and fuzz every target, FUZZ_SECONDS in all:
#                                half to checkpoint, a sixth to each other one;
#                                new inputs go to build/fuzz/corpus (checkpoint)
#                                or build/fuzz/corpus-<target>, crashes to
#                                build/fuzz/artifacts/<target>-*
#   make fuzz FUZZ_TARGET=dataset [FUZZ_SECONDS=300]
#                                one target for all of FUZZ_SECONDS
#   make fuzz-check [FUZZ_TARGET=...]
#                                the same binaries over every seed file once
#                                (no fuzzing)
#   make fuzz-corpus             regenerate tests/fuzz/corpus/valid-* and
#                                tests/fuzz/regress/bad-* (fuzz/make_corpus.c);
#                                the *-v1-* files (written by the release that
#                                wrote model config version 1) stay as they are;
#                                the other targets' seeds are kept by hand
# The normal test suite runs the same entry points over the same files:
# tests/test_fuzz_regress.c includes fuzz/fuzz_checkpoint.c, and
# tests/test_fuzz_<target>.c includes fuzz/fuzz_<target>.c.
# Needs clang, libclang-rt-dev (libFuzzer's runtime) and libomp-dev (clang's
# -fopenmp); Debian 12: apt-get install clang libclang-rt-dev libomp-dev.

FUZZ_CC          ?= clang
FUZZ_SECONDS     ?= 60
FUZZ_ARGS        ?=
FUZZ_DIR         := build/fuzz
FUZZ_TARGETS     := checkpoint dataset cache report
FUZZ_TARGET      ?= all
FUZZ_SEEDS       := tests/fuzz/corpus
FUZZ_REGRESS     := tests/fuzz/regress
FUZZ_CFLAGS      := -std=c11 -D_DEFAULT_SOURCE -g -O1 -fno-omit-frame-pointer -fopenmp \
                    -fsanitize=address,undefined -fno-sanitize-recover=all \
                    -DMP_LIBFUZZER -Iinclude -Isrc \
                    -Wno-pass-failed
# (-Wno-pass-failed: at -O1 clang declines some `omp simd` loops and says so;
# an optimisation remark about a build made for coverage, not a defect.)
# The fuzzer never needs MPI: it always builds the stub of src/dist/.
FUZZ_LIB_SRC      = $(filter-out src/dist/dist_mpi.c src/dist/reducer_mpi.c src/dist/dist_stub.c,$(LIB_SRC)) \
                    src/dist/dist_stub.c
FUZZ_LIB_OBJ      = $(FUZZ_LIB_SRC:%.c=$(FUZZ_DIR)/obj/%.o)
# The report's objects of the CLI (report_cmd.c writes the page).
FUZZ_REPORT_CLI  := report_cmd report_read report_svg report_layers

# Per target: seed directories, libFuzzer's new inputs, the longest input,
# other flags, and its share of FUZZ_SECONDS (in sixths).
FUZZ_SEEDS_checkpoint  := $(FUZZ_SEEDS) $(FUZZ_REGRESS)
FUZZ_CORPUS_checkpoint := $(FUZZ_DIR)/corpus
FUZZ_MAXLEN_checkpoint := 65536
FUZZ_OPTS_checkpoint   := -dict=fuzz/checkpoint.dict
FUZZ_MAXLEN_dataset    := 16384
FUZZ_MAXLEN_cache      := 8200
FUZZ_MAXLEN_report     := 16384
# (the report writes notes and its "report: ..." line for every input)
FUZZ_OPTS_report       := -close_fd_mask=3
$(foreach t,dataset cache report,$(eval FUZZ_SEEDS_$(t) := tests/fuzz/$(t)) \
    $(eval FUZZ_CORPUS_$(t) := $(FUZZ_DIR)/corpus-$(t)))
ifeq ($(FUZZ_TARGET),all)
FUZZ_RUN               := $(FUZZ_TARGETS)
FUZZ_SHARE_checkpoint  := 3
FUZZ_SHARE_dataset     := 1
FUZZ_SHARE_cache       := 1
FUZZ_SHARE_report      := 1
else ifneq ($(filter $(FUZZ_TARGET),$(FUZZ_TARGETS)),)
FUZZ_RUN               := $(FUZZ_TARGET)
FUZZ_SHARE_$(FUZZ_TARGET) := 6
else
$(error FUZZ_TARGET=$(FUZZ_TARGET): one of $(FUZZ_TARGETS), or all)
endif

.PHONY: fuzz fuzz-check fuzz-corpus deps-fuzz

deps-fuzz:
	@sh scripts/deps.sh fuzz

# Library objects get the fuzzer's coverage instrumentation without its main.
$(FUZZ_DIR)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

# (the targets' objects are kept: make would delete them as intermediates)
.SECONDARY: $(FUZZ_TARGETS:%=$(FUZZ_DIR)/obj/fuzz/fuzz_%.o)
$(FUZZ_DIR)/fuzz_report: $(FUZZ_REPORT_CLI:%=$(FUZZ_DIR)/obj/src/cli/%.o)
$(FUZZ_DIR)/fuzz_%: $(FUZZ_LIB_OBJ) $(FUZZ_DIR)/obj/fuzz/fuzz_%.o
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $(filter %.o,$^) -ljansson -lz -lm

# -timeout: an input taking 10 s is a finding (the loader must stay cheap on
# any input); the seeds (and regression inputs) start the corpus.
fuzz: deps-fuzz
	@$(MAKE) --no-print-directory $(FUZZ_RUN:%=$(FUZZ_DIR)/fuzz_%)
	@$(MAKE) --no-print-directory $(FUZZ_RUN:%=fuzz-run-%)

fuzz-run-%:
	@mkdir -p $(FUZZ_CORPUS_$*) $(FUZZ_DIR)/artifacts
	@s=$$(( $(FUZZ_SECONDS) * $(FUZZ_SHARE_$*) / 6 )); [ $$s -ge 1 ] || s=1; \
	echo "fuzz: $* for $$s s"; set -x; \
	$(FUZZ_DIR)/fuzz_$* -max_total_time=$$s -rss_limit_mb=4096 -max_len=$(FUZZ_MAXLEN_$*) \
		-timeout=10 -print_final_stats=1 $(FUZZ_OPTS_$*) \
		-artifact_prefix=$(FUZZ_DIR)/artifacts/$*- $(FUZZ_ARGS) \
		$(FUZZ_CORPUS_$*) $(FUZZ_SEEDS_$*)

fuzz-check: deps-fuzz
	@$(MAKE) --no-print-directory $(FUZZ_RUN:%=$(FUZZ_DIR)/fuzz_%)
	@$(MAKE) --no-print-directory $(FUZZ_RUN:%=fuzz-check-%)

fuzz-check-%:
	$(FUZZ_DIR)/fuzz_$* -rss_limit_mb=4096 -timeout=10 $(FUZZ_OPTS_$*) \
		$(addsuffix /*,$(FUZZ_SEEDS_$*))

# The report's regression test links the same CLI objects.
$(BUILD)/tests/test_fuzz_report: $(BUILD)/obj/tests/test_fuzz_report.o $(TEST_COMMON) \
		$(FUZZ_REPORT_CLI:%=$(BUILD)/obj/src/cli/%.o) $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $(filter %.o,$^) $(STATIC) -lcmocka $(LDLIBS_ALL)

$(BUILD)/fuzz/make_corpus: $(BUILD)/obj/fuzz/make_corpus.o $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $< $(STATIC) $(LDLIBS_ALL)

fuzz-corpus: $(BUILD)/fuzz/make_corpus
	find $(FUZZ_SEEDS) $(FUZZ_REGRESS) \( -name 'valid-*' -o -name 'bad-*' \) ! -name '*-v1-*' -delete
	$(BUILD)/fuzz/make_corpus $(FUZZ_SEEDS) $(FUZZ_REGRESS)
