/* axon-bench peak internals, shared with axon-bench gemm (the share of the
 * peak a GEMM reaches). Internal to axon-bench. */
#ifndef AX_AXON_BENCH_PEAK_H
#define AX_AXON_BENCH_PEAK_H

/* The arithmetic kinds a peak is measured for. */
enum { AXI_PEAK_FP32 = 0, AXI_PEAK_BF16 = 1 };

/* One peak: GFLOP/s from the wall clock (the best of `repeat` runs) and
 * from the process's CPU time divided by the threads (the same runs; a
 * loaded machine's preemption does not count there). */
typedef struct axi_peak {
  double gflops, cpu_gflops;
} axi_peak;

/* Measures `kind` on `threads` threads, each running the same multiply-add
 * loop (axon_bench_peak.c says what one instruction counts). AX_OK, or
 * AX_EUNSUPPORTED when this CPU has no such instructions (the message says
 * which). */
int axi_bench_peak(int kind, int threads, int repeat, axi_peak *out);

#endif
