/* axon-bench rpc: placeholder until the benchmark lands. */
#include <stdio.h>

int ax_bench_rpc_main(int argc, char **argv) {
  fprintf(stderr, "axon-bench rpc: not implemented yet\n");
  return 2;
}
