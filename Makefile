# Thin wrapper over CMake: `make demo` runs the main job, `make test` the
# tests. Both install missing Debian packages first (scripts/deps.sh).
BUILD ?= build
FUZZ_BUILD ?= build-fuzz
SECONDS ?= 60
# Seconds per harness in `make test` (7 harnesses).
FUZZ_TEST_SECONDS ?= 12
JOBS ?= $(shell nproc)
CTEST_ARGS ?=

.PHONY: all deps build demo test clean fuzz fuzz-build format

all: build

deps:
	@bash scripts/deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

demo: build
	@bash scripts/demo.sh $(BUILD)

# The libFuzzer harnesses (tests/fuzz): their own build with clang, ASan,
# UBSan and libFuzzer; `make fuzz SECONDS=N` runs each for N seconds on a
# scratch copy of its seed corpus.
fuzz-build: deps
	@CC=clang cmake -S . -B $(FUZZ_BUILD) -DAXON_FUZZ=ON \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(FUZZ_BUILD) -j$(JOBS)

fuzz: fuzz-build
	@bash scripts/fuzz.sh $(FUZZ_BUILD) $(SECONDS)

# The RPC tests under AddressSanitizer first, then every fuzz harness for a
# short bounded time (ASan + UBSan; a crash, leak or UB report fails),
# then the whole suite but the full fault sweep (ctest -L faults runs it).
test: build fuzz-build
	@cmake --build $(BUILD) --target check-rpc-asan
	@bash scripts/fuzz.sh $(FUZZ_BUILD) $(FUZZ_TEST_SECONDS)
	@cd $(BUILD) && ctest --output-on-failure -j2 -LE faults $(CTEST_ARGS)

# Rewrites the C sources to the checked-in .clang-format (make test checks
# them: ctest test_format).
format: deps
	@bash scripts/check_format.sh --fix

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD)
