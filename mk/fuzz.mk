# mk/fuzz.mk - the checkpoint loader under libFuzzer. Included by the Makefile
# after it defines LIB_SRC, BUILD, CC, LDLIBS_ALL and STATIC (rule targets and
# prerequisites use them as they are read), e.g. at its end.
#   make fuzz [FUZZ_SECONDS=60]  build build/fuzz/fuzz_checkpoint with clang
#                                (libFuzzer + AddressSanitizer + UBSan, every
#                                library source compiled with the instrumentation)
#                                and fuzz for FUZZ_SECONDS; new inputs go to
#                                build/fuzz/corpus, crashes to build/fuzz/artifacts/
#   make fuzz-check              the same binary over every file of tests/fuzz/
#                                once (no fuzzing)
#   make fuzz-corpus             regenerate tests/fuzz/corpus/valid-* and
#                                tests/fuzz/regress/bad-* (fuzz/make_corpus.c);
#                                the *-v1-* files (written by the release that
#                                wrote model config version 1) stay as they are
# The normal test suite runs the same entry point over the same files:
# tests/test_fuzz_regress.c includes fuzz/fuzz_checkpoint.c.
# Needs clang, libclang-rt-dev (libFuzzer's runtime) and libomp-dev (clang's
# -fopenmp); Debian 12: apt-get install clang libclang-rt-dev libomp-dev.

FUZZ_CC          ?= clang
FUZZ_SECONDS     ?= 60
FUZZ_ARGS        ?=
FUZZ_DIR         := build/fuzz
FUZZ_BIN         := $(FUZZ_DIR)/fuzz_checkpoint
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
FUZZ_OBJ          = $(FUZZ_LIB_SRC:%.c=$(FUZZ_DIR)/obj/%.o) $(FUZZ_DIR)/obj/fuzz/fuzz_checkpoint.o

.PHONY: fuzz fuzz-check fuzz-corpus deps-fuzz

deps-fuzz:
	@sh scripts/deps.sh fuzz

# Library objects get the fuzzer's coverage instrumentation without its main.
$(FUZZ_DIR)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

$(FUZZ_BIN): $(FUZZ_OBJ)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $(FUZZ_OBJ) -ljansson -lz -lm

# -timeout: an input taking 10 s is a finding (the loader must stay cheap on
# any input); the seeds and the regression inputs start the corpus.
fuzz: deps-fuzz
	@$(MAKE) --no-print-directory $(FUZZ_BIN)
	@mkdir -p $(FUZZ_DIR)/corpus $(FUZZ_DIR)/artifacts
	$(FUZZ_BIN) -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096 -max_len=65536 \
		-timeout=10 -print_final_stats=1 -dict=fuzz/checkpoint.dict \
		-artifact_prefix=$(FUZZ_DIR)/artifacts/ $(FUZZ_ARGS) \
		$(FUZZ_DIR)/corpus $(FUZZ_SEEDS) $(FUZZ_REGRESS)

fuzz-check: deps-fuzz
	@$(MAKE) --no-print-directory $(FUZZ_BIN)
	$(FUZZ_BIN) -rss_limit_mb=4096 -timeout=10 $(FUZZ_SEEDS)/* $(FUZZ_REGRESS)/*

$(BUILD)/fuzz/make_corpus: $(BUILD)/obj/fuzz/make_corpus.o $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $< $(STATIC) $(LDLIBS_ALL)

fuzz-corpus: $(BUILD)/fuzz/make_corpus
	find $(FUZZ_SEEDS) $(FUZZ_REGRESS) \( -name 'valid-*' -o -name 'bad-*' \) ! -name '*-v1-*' -delete
	$(BUILD)/fuzz/make_corpus $(FUZZ_SEEDS) $(FUZZ_REGRESS)
