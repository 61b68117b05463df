/* data_parallel: N replicas of a model trained on shards of Fashion-MNIST,
 * combined by a ring all-reduce of gradients (overlapped with the
 * backward), EASGD or D-PSGD. Either start each replica yourself
 * (--rank/--world-size/--master) or let --local N fork N replicas on this
 * machine (before any gRPC initialisation, which must not cross a fork). */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dp.h"
#include <axon/rpc/launch.h>

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: data_parallel [--local N | --rank R --world-size N --master "
      "HOST:PORT]\n"
      "  --algo allreduce|easgd|dpsgd   how replicas combine (allreduce)\n"
      "  --model mlp|resnet20           (mlp); --model-config k=v,...\n"
      "  --data-config k=v,...          Fashion-MNIST settings, e.g. "
      "limit=4096\n"
      "  --optim k=v,...                (opt=sgd,lr=0.05)\n"
      "  --steps S --batch B            steps, examples per replica per step "
      "(300, 32)\n"
      "  --bucket-kb K                  all-reduce bucket size (256)\n"
      "  --tau T --alpha A              EASGD period (4) and elastic rate "
      "(0.9/N)\n"
      "  --eval-limit N                 test examples for the accuracy (2000)\n"
      "  --seed S --timeout-ms MS       (1, 20000)\n"
      "  --listen HOST:PORT             this replica's address (any port)\n"
      "  --dump FILE                    rank 0 writes its final parameters "
      "(raw f32)\n"
      "  --die-rank R --die-step K      fault injection: rank R exits at step "
      "K\n"
      "  --quiet                        no progress bar\n"
      "  --bench-allreduce MB           time all-reduces of MB MiB, print bus "
      "bandwidth\n"
      "  --threads T                    CPU kernel threads (--local: cores / "
      "N)\n"
      "  --time-limit S                 --local: kill replicas still running "
      "after S s\n");
}

/* Forks n replicas, waits (bounded by limit_s) and reports their exits.
 * Succeeds when every replica that was not told to die exited with 0. */
static int launch(dp_opts *o, int n, int limit_s) {
  static char master[64];
  snprintf(master, sizeof master, "127.0.0.1:%d", ax_local_free_port());
  o->master = master;
  o->world = n;
  pid_t pids[256];
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      o->rank = r;
      if (o->threads <= 0) { /* N replicas share this machine's cores */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        o->threads = cores / n > 1 ? (int)(cores / n) : 1;
      }
      int code = o->bench_mb > 0 ? dp_bench_allreduce(o) : dp_replica(o);
      fflush(stdout);
      _exit(code);
    }
  }
  int bad = 0, sts[256];
  ax_local_reap(n, pids, (int64_t)limit_s * 1000, sts);
  for (int r = 0; r < n; r++) {
    int st = sts[r];
    if (st == -1) {
      fprintf(stderr, "dp: launcher: replica %d still running: killed\n", r);
      bad = 1;
      continue;
    }
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (r == o->die_rank && o->die_step >= 0)
      fprintf(stderr, "dp: launcher: replica %d exited (%d) as injected\n", r,
              code);
    else if (code != 0) {
      fprintf(stderr, "dp: launcher: replica %d failed (%d)\n", r, code);
      bad = 1;
    }
  }
  return bad ? 1 : 0;
}

int main(int argc, char **argv) {
  dp_opts o = {.rank = -1,
               .world = 0,
               .algo = "allreduce",
               .model = "mlp",
               .optim = "opt=sgd,lr=0.05",
               .steps = 300,
               .batch = 32,
               .bucket_kb = 256,
               .tau = 4,
               .alpha = -1,
               .eval_limit = 2000,
               .seed = 1,
               .timeout_ms = 20000,
               .die_rank = -1,
               .die_step = -1};
  int local = 0, limit_s = 3600;
  static const struct option lo[] = {{"local", 1, 0, 'L'},
                                     {"rank", 1, 0, 'r'},
                                     {"world-size", 1, 0, 'w'},
                                     {"master", 1, 0, 'm'},
                                     {"listen", 1, 0, 'l'},
                                     {"algo", 1, 0, 'a'},
                                     {"model", 1, 0, 'M'},
                                     {"model-config", 1, 0, 'C'},
                                     {"data-config", 1, 0, 'D'},
                                     {"optim", 1, 0, 'o'},
                                     {"steps", 1, 0, 's'},
                                     {"batch", 1, 0, 'b'},
                                     {"bucket-kb", 1, 0, 'k'},
                                     {"tau", 1, 0, 't'},
                                     {"alpha", 1, 0, 'A'},
                                     {"eval-limit", 1, 0, 'e'},
                                     {"seed", 1, 0, 'S'},
                                     {"timeout-ms", 1, 0, 'T'},
                                     {"dump", 1, 0, 'd'},
                                     {"die-rank", 1, 0, 'R'},
                                     {"die-step", 1, 0, 'K'},
                                     {"quiet", 0, 0, 'q'},
                                     {"time-limit", 1, 0, 'x'},
                                     {"bench-allreduce", 1, 0, 'B'},
                                     {"threads", 1, 0, 'j'},
                                     {"help", 0, 0, 'h'},
                                     {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    switch (c) {
    case 'L':
      local = atoi(optarg);
      break;
    case 'r':
      o.rank = atoi(optarg);
      break;
    case 'w':
      o.world = atoi(optarg);
      break;
    case 'm':
      o.master = optarg;
      break;
    case 'l':
      o.listen = optarg;
      break;
    case 'a':
      o.algo = optarg;
      break;
    case 'M':
      o.model = optarg;
      break;
    case 'C':
      o.model_config = optarg;
      break;
    case 'D':
      o.data_config = optarg;
      break;
    case 'o':
      o.optim = optarg;
      break;
    case 's':
      o.steps = atol(optarg);
      break;
    case 'b':
      o.batch = atoi(optarg);
      break;
    case 'k':
      o.bucket_kb = atoi(optarg);
      break;
    case 't':
      o.tau = atoi(optarg);
      break;
    case 'A':
      o.alpha = atof(optarg);
      break;
    case 'e':
      o.eval_limit = atol(optarg);
      break;
    case 'S':
      o.seed = strtoull(optarg, NULL, 10);
      break;
    case 'T':
      o.timeout_ms = atoll(optarg);
      break;
    case 'd':
      o.dump = optarg;
      break;
    case 'R':
      o.die_rank = atoi(optarg);
      break;
    case 'K':
      o.die_step = atol(optarg);
      break;
    case 'q':
      o.quiet = 1;
      break;
    case 'x':
      limit_s = atoi(optarg);
      break;
    case 'j':
      o.threads = atoi(optarg);
      break;
    case 'B':
      o.bench_mb = atof(optarg);
      break;
    case 'h':
      usage(stdout);
      return 0;
    default:
      usage(stderr);
      return 2;
    }
  }
  if (local > 0)
    return local > 256 ? 2 : launch(&o, local, limit_s);
  if (o.rank < 0 || o.world < 1 || o.rank >= o.world || !o.master) {
    usage(stderr);
    return 2;
  }
  return o.bench_mb > 0 ? dp_bench_allreduce(&o) : dp_replica(&o);
}
