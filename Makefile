# Thin wrapper over CMake: `make demo` runs the main job, `make test` the
# tests. Both install missing Debian packages first (scripts/deps.sh).
BUILD ?= build
JOBS ?= $(shell nproc)
CTEST_ARGS ?=

.PHONY: all deps build demo test clean

all: build

deps:
	@bash scripts/deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

demo: build
	@bash scripts/demo.sh $(BUILD)

# The RPC tests under AddressSanitizer first, then the whole suite.
test: build
	@cmake --build $(BUILD) --target check-rpc-asan
	@cd $(BUILD) && ctest --output-on-failure -j2 $(CTEST_ARGS)

clean:
	rm -rf $(BUILD)
