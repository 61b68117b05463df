/* axon-linkemu: the test bed's links (tests/netns/netbed.sh). One TUN
 * device "ax0" in each named network namespace, every IPv4 packet a host
 * sends read here and written into the destination host's device after the
 * link's serialisation time (rate), delay and jitter, or dropped (loss, or a
 * queue longer than the link's limit). This kernel has no netem qdisc, so
 * delay, jitter and loss are emulated in user space; rate is too, so that
 * one program shapes every link the same way.
 *
 *   axon-linkemu --ready FILE [--default SPEC] [--link I-J:SPEC ...]
 *                NS:ADDR ...
 *
 * Host i is the i-th NS:ADDR (ADDR its IPv4 address; packets are routed by
 * destination address). SPEC: delay_ms=D,jitter_ms=J,rate_mbit=R,loss=P
 * (P a fraction), queue_ms=Q (tail drop past Q ms of backlog; default 100).
 * A link I-J is shaped both ways. FILE is written once every device exists;
 * the script then gives the devices their addresses. SIGTERM ends it; the
 * devices go with it. Runs as root. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define MAXH 16
#define PKT 65536

typedef struct spec {
  double delay_ms, jitter_ms, rate_mbit, loss, queue_ms;
} spec;

typedef struct pkt {
  struct pkt *next;
  int64_t due_ns;
  size_t len;
  uint8_t data[];
} pkt;

typedef struct link {
  spec s;
  int64_t busy_until, last_due; /* serialisation; FIFO order */
  pkt *head, **tail;
  uint64_t sent, dropped;
} emu_link;

static int g_n, g_fd[MAXH];
static uint32_t g_addr[MAXH];
static emu_link g_link[MAXH][MAXH];
static volatile sig_atomic_t g_stop;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int parse_spec(const char *txt, spec *s) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", txt);
  for (char *save, *kv = strtok_r(buf, ",", &save); kv;
       kv = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(kv, '=');
    if (!eq)
      return -1;
    *eq++ = 0;
    char *end;
    double v = strtod(eq, &end);
    if (end == eq || *end || !(v >= 0) || v > 1e9) /* empty, junk, NaN */
      return -1;
    if (!strcmp(kv, "delay_ms"))
      s->delay_ms = v;
    else if (!strcmp(kv, "jitter_ms"))
      s->jitter_ms = v;
    else if (!strcmp(kv, "rate_mbit"))
      s->rate_mbit = v;
    else if (!strcmp(kv, "loss") && v <= 1)
      s->loss = v;
    else if (!strcmp(kv, "queue_ms"))
      s->queue_ms = v;
    else
      return -1;
  }
  return 0;
}

/* A TUN device "ax0" inside namespace ns (entered, then left). */
static int tun_in(const char *ns) {
  char path[256];
  snprintf(path, sizeof path, "/run/netns/%s", ns);
  int self = open("/proc/self/ns/net", O_RDONLY), target = open(path, O_RDONLY);
  if (self < 0 || target < 0 || setns(target, CLONE_NEWNET)) {
    fprintf(stderr, "axon-linkemu: cannot enter namespace %s: %s\n", ns,
            strerror(errno));
    return -1;
  }
  int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
  struct ifreq ifr = {0};
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  snprintf(ifr.ifr_name, IFNAMSIZ, "ax0");
  if (fd < 0 || ioctl(fd, TUNSETIFF, &ifr)) {
    fprintf(stderr, "axon-linkemu: TUN in %s: %s\n", ns, strerror(errno));
    fd = -1;
  }
  if (setns(self, CLONE_NEWNET))
    fd = -1;
  close(self);
  close(target);
  if (fd >= 0)
    fcntl(fd, F_SETFL, O_NONBLOCK);
  return fd;
}

static int host_of(uint32_t addr) {
  for (int i = 0; i < g_n; i++)
    if (g_addr[i] == addr)
      return i;
  return -1;
}

/* A packet from host i: onto its link's queue, or dropped. */
static void take(int i, const uint8_t *p, size_t len, int64_t now) {
  if (len < 20 || (p[0] >> 4) != 4)
    return; /* IPv4 only */
  uint32_t dst;
  memcpy(&dst, p + 16, 4);
  int j = host_of(dst);
  if (j < 0 || j == i)
    return;
  emu_link *l = &g_link[i][j];
  if (l->s.loss > 0 && drand48() < l->s.loss) {
    l->dropped++;
    return;
  }
  int64_t start = l->busy_until > now ? l->busy_until : now;
  if ((double)(start - now) > l->s.queue_ms * 1e6) {
    l->dropped++; /* tail drop: the sender's congestion control sees it */
    return;
  }
  int64_t ser =
      l->s.rate_mbit > 0 ? (int64_t)((double)len * 8e3 / l->s.rate_mbit) : 0;
  l->busy_until = start + ser;
  double jit = l->s.jitter_ms > 0 ? (drand48() * 2 - 1) * l->s.jitter_ms : 0;
  int64_t due = l->busy_until + (int64_t)((l->s.delay_ms + jit) * 1e6);
  if (due < l->last_due)
    due = l->last_due; /* no reordering */
  l->last_due = due;
  pkt *k = malloc(sizeof *k + len);
  if (!k)
    return;
  k->next = NULL;
  k->due_ns = due;
  k->len = len;
  memcpy(k->data, p, len);
  *l->tail = k;
  l->tail = &k->next;
}

/* Delivers what is due; returns the next due time (INT64_MAX: none). */
static int64_t deliver(int64_t now) {
  int64_t next = INT64_MAX;
  for (int i = 0; i < g_n; i++)
    for (int j = 0; j < g_n; j++) {
      emu_link *l = &g_link[i][j];
      while (l->head && l->head->due_ns <= now) {
        pkt *k = l->head;
        if (!(l->head = k->next))
          l->tail = &l->head;
        /* A device that is down (a cut link) takes nothing. */
        if (write(g_fd[j], k->data, k->len) == (ssize_t)k->len)
          l->sent++;
        else
          l->dropped++;
        free(k);
      }
      if (l->head && l->head->due_ns < next)
        next = l->head->due_ns;
    }
  return next;
}

static void on_term(int sig) { (void)sig, g_stop = 1; }

int main(int argc, char **argv) {
  spec def = {.queue_ms = 100};
  const char *ready = NULL;
  const char *links[64];
  int nlinks = 0;
  for (int a = 1; a < argc; a++) {
    if (!strcmp(argv[a], "--ready") && a + 1 < argc) {
      ready = argv[++a];
    } else if (!strcmp(argv[a], "--default") && a + 1 < argc) {
      if (parse_spec(argv[++a], &def)) {
        fprintf(stderr, "axon-linkemu: bad --default %s\n", argv[a]);
        return 2;
      }
    } else if (!strcmp(argv[a], "--link") && a + 1 < argc && nlinks < 64) {
      links[nlinks++] = argv[++a];
    } else if (strchr(argv[a], ':') && g_n < MAXH) {
      char ns[128];
      const char *c = strchr(argv[a], ':');
      snprintf(ns, sizeof ns, "%.*s", (int)(c - argv[a]), argv[a]);
      if (inet_pton(AF_INET, c + 1, &g_addr[g_n]) != 1 ||
          (g_fd[g_n] = tun_in(ns)) < 0) {
        fprintf(stderr, "axon-linkemu: bad host %s\n", argv[a]);
        return 2;
      }
      g_n++;
    } else {
      fprintf(stderr, "usage: axon-linkemu --ready FILE [--default SPEC] "
                      "[--link I-J:SPEC ...] NS:ADDR ...\n");
      return 2;
    }
  }
  for (int i = 0; i < g_n; i++)
    for (int j = 0; j < g_n; j++) {
      g_link[i][j].s = def;
      g_link[i][j].tail = &g_link[i][j].head;
    }
  for (int k = 0; k < nlinks; k++) {
    int i, j, off = 0;
    if (sscanf(links[k], "%d-%d:%n", &i, &j, &off) != 2 || !off || i < 0 ||
        j < 0 || i >= g_n || j >= g_n ||
        parse_spec(links[k] + off, &g_link[i][j].s)) {
      fprintf(stderr, "axon-linkemu: bad --link %s\n", links[k]);
      return 2;
    }
    g_link[j][i].s = g_link[i][j].s;
  }
  srand48(1);
  signal(SIGTERM, on_term);
  signal(SIGINT, on_term);
  if (ready) {
    FILE *f = fopen(ready, "w");
    if (f)
      fprintf(f, "%d\n", (int)getpid()), fclose(f);
  }
  static uint8_t buf[PKT];
  struct pollfd pf[MAXH];
  for (int i = 0; i < g_n; i++)
    pf[i] = (struct pollfd){.fd = g_fd[i], .events = POLLIN};
  while (!g_stop) {
    int64_t now = now_ns(), next = deliver(now);
    struct timespec ts, *tp = NULL;
    if (next != INT64_MAX) {
      int64_t wait = next - now_ns();
      wait = wait < 0 ? 0 : wait;
      ts.tv_sec = wait / 1000000000;
      ts.tv_nsec = wait % 1000000000;
      tp = &ts;
    }
    if (ppoll(pf, (nfds_t)g_n, tp, NULL) < 0 && errno != EINTR)
      break;
    now = now_ns();
    for (int i = 0; i < g_n; i++) {
      if (!(pf[i].revents & POLLIN))
        continue;
      for (int burst = 0; burst < 64; burst++) {
        ssize_t r = read(g_fd[i], buf, sizeof buf);
        if (r <= 0)
          break;
        take(i, buf, (size_t)r, now);
      }
    }
  }
  uint64_t sent = 0, dropped = 0;
  for (int i = 0; i < g_n; i++)
    for (int j = 0; j < g_n; j++)
      sent += g_link[i][j].sent, dropped += g_link[i][j].dropped;
  fprintf(stderr, "axon-linkemu: %llu packets delivered, %llu dropped\n",
          (unsigned long long)sent, (unsigned long long)dropped);
  return 0;
}
