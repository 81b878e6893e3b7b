# Convenience targets; the scripts are the source of truth.
.PHONY: deps build debug test demo fuzz bench format lint clean
deps: ; scripts/install-deps
build: ; scripts/build release
debug: ; scripts/build debug
test: ; scripts/test
demo: ; scripts/demo
fuzz: ; scripts/fuzz
bench: build ; build/release/bench/lifecycle_bench
format: ; scripts/lint fix
lint: ; scripts/lint format && scripts/lint tidy
clean: ; rm -rf build
