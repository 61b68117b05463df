/* Faults at named points for tests (fault-impl.h): AXON_FAULT, read once. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "axon/kernels/error.h"
#include "axon/runtime/pipeline/stage/fault-impl.h"

#define FAULTS_MAX 8
#define VALUE_MAX 1024

enum { P_NONE, P_ACTION, P_CKPT_WRITE, P_HANDOFF };

typedef struct fault {
  int point;
  axi_pipe_fault_act act; /* P_ACTION's */
  char agent[128];        /* "": any node */
  long stage, unit, step; /* -1: any */
} fault;

static const char *const g_acts[] = {"F", "B", "I", "W", "STEP"};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static fault g_faults[FAULTS_MAX];
static int g_n;   /* faults armed */
static int g_err; /* the outcome of reading AXON_FAULT */
static char g_msg[VALUE_MAX + 256];

/* A non-negative decimal number into *v; 0 if s is not one. */
static int number(const char *s, long *v) {
  char *end;
  errno = 0;
  long x = strtol(s, &end, 10);
  if (!*s || *end || errno || x < 0 || *s == '+' || *s == '-')
    return 0;
  *v = x;
  return 1;
}

/* One item of a fault ("key=value" or a bare point) into f; NULL, or why
 * it is wrong. */
static const char *item(char *it, fault *f, unsigned *seen) {
  char *eq = strchr(it, '=');
  const char *val = eq ? eq + 1 : NULL;
  if (eq)
    *eq = 0;
  static const char *const keys[] = {"action", "agent", "stage",
                                     "unit",   "step",  NULL};
  int k = 0;
  while (keys[k] && strcmp(keys[k], it))
    k++;
  if (!eq) { /* a bare point */
    int p = !strcmp(it, "ckpt-write") ? P_CKPT_WRITE
            : !strcmp(it, "handoff")  ? P_HANDOFF
                                      : P_NONE;
    if (p == P_NONE)
      return keys[k] ? "a key without '=value'"
                     : "unknown item (action=, ckpt-write, handoff, agent=, "
                       "stage=, unit=, step=)";
    if (f->point != P_NONE)
      return "two points in one fault (one of action=, ckpt-write, handoff)";
    f->point = p;
    return NULL;
  }
  if (!keys[k])
    return "unknown key (action, agent, stage, unit, step)";
  if (*seen & (1u << k))
    return "a key given twice";
  *seen |= 1u << k;
  if (k == 0) { /* action */
    int a = 0;
    while (a <= AXI_PIPE_FAULT_STEP && strcmp(g_acts[a], val))
      a++;
    if (a > AXI_PIPE_FAULT_STEP)
      return "action= takes F, B, I, W or STEP";
    if (f->point != P_NONE)
      return "two points in one fault (one of action=, ckpt-write, handoff)";
    f->point = P_ACTION;
    f->act = (axi_pipe_fault_act)a;
    return NULL;
  }
  if (k == 1) {
    if (!*val || strlen(val) >= sizeof f->agent || strpbrk(val, " \t"))
      return "agent= takes a node's name";
    snprintf(f->agent, sizeof f->agent, "%s", val);
    return NULL;
  }
  long *dst = k == 2 ? &f->stage : k == 3 ? &f->unit : &f->step;
  return number(val, dst) ? NULL : "stage=, unit= and step= take a number >= 0";
}

/* One fault (its items, comma-separated) into f; NULL, or why it is wrong. */
static const char *one_fault(char *text, fault *f) {
  memset(f, 0, sizeof *f);
  f->stage = f->unit = f->step = -1;
  unsigned seen = 0;
  for (char *it = text, *next; it; it = next) {
    next = strchr(it, ',');
    if (next)
      *next++ = 0;
    if (!*it)
      return "an empty item";
    const char *why = item(it, f, &seen);
    if (why)
      return why;
  }
  if (f->point == P_NONE)
    return "no point (one of action=, ckpt-write, handoff)";
  if (f->unit >= 0 && (f->point != P_ACTION || f->act == AXI_PIPE_FAULT_STEP))
    return "unit= applies to action=F, B, I and W only";
  if (f->step >= 0 && f->point == P_HANDOFF)
    return "step= does not apply to handoff";
  return NULL;
}

static void read_env(void) {
  const char *v = getenv("AXON_FAULT");
  if (!v)
    return;
  char buf[VALUE_MAX];
  const char *why = NULL;
  int n = 0;
  if (strlen(v) >= sizeof buf)
    why = "too long";
  else
    snprintf(buf, sizeof buf, "%s", v);
  for (char *f = buf, *next; !why && f; f = next) {
    next = strchr(f, ';');
    if (next)
      *next++ = 0;
    if (n == FAULTS_MAX)
      why = "more than 8 faults";
    else
      why = !*f ? "an empty fault" : one_fault(f, &g_faults[n++]);
  }
  if (why) {
    g_err = AX_EINVAL;
    snprintf(g_msg, sizeof g_msg, "AXON_FAULT='%.*s': %s (docs/TESTBED.md)",
             VALUE_MAX, v, why);
    return;
  }
  g_n = n;
}

int axi_pipe_fault_init(void) {
  pthread_once(&g_once, read_env);
  return g_err == AX_OK ? AX_OK : ax_seterr(g_err, "%s", g_msg);
}

/* The first fault at point that matches, or NULL. */
static const fault *match(ax_node *n, int point, axi_pipe_fault_act act,
                          long stage, long unit, long step) {
  pthread_once(&g_once, read_env);
  for (int i = 0; i < g_n; i++) {
    const fault *f = &g_faults[i];
    if (f->point == point && (point != P_ACTION || f->act == act) &&
        (!f->agent[0] || (n && !strcmp(ax_node_name(n), f->agent))) &&
        (f->stage < 0 || f->stage == stage) &&
        (f->unit < 0 || f->unit == unit) && (f->step < 0 || f->step == step))
      return f;
  }
  return NULL;
}

/* Says where, then ends the process as a crash would. */
static void die(ax_node *n, const char *where) {
  char line[512];
  int k =
      snprintf(line, sizeof line, "axon fault: %s dies at %s (AXON_FAULT)\n",
               n ? ax_node_name(n) : "a process", where);
  if (k > 0 && write(STDERR_FILENO, line, (size_t)k) < 0)
    k = 0; /* nothing more to do about it */
  _exit(AXI_PIPE_FAULT_STATUS);
}

void axi_pipe_fault_action(ax_node *n, int stage, axi_pipe_fault_act act,
                           long step, long unit) {
  if (step < 0 || !match(n, P_ACTION, act, stage, unit, step))
    return;
  char where[160];
  if (act == AXI_PIPE_FAULT_STEP)
    snprintf(where, sizeof where, "STEP of mini-batch %ld on stage %d", step,
             stage);
  else
    snprintf(where, sizeof where,
             "%s of unit %ld of mini-batch %ld on stage %d", g_acts[act], unit,
             step, stage);
  die(n, where);
}

void axi_pipe_fault_ckpt_write(ax_node *n, int stage, const char *path,
                               const void *buf, size_t len) {
  long step = -1; /* the step of the checkpoint directory ckpt-N, if any */
  for (const char *c = path; (c = strstr(c, "ckpt-")); c++) {
    char *end;
    long v = strtol(c + 5, &end, 10);
    if (end != c + 5 && *end == '/')
      step = v;
  }
  if (!match(n, P_CKPT_WRITE, AXI_PIPE_FAULT_F, stage, -1, step))
    return;
  char tmp[1100], where[1200];
  snprintf(tmp, sizeof tmp, "%s.tmp", path); /* as axi_write_atomic names it */
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ssize_t put = fd >= 0 ? write(fd, buf, len / 2) : -1;
  snprintf(where, sizeof where, "writing %s (stage %d, %zd of %zu bytes)", tmp,
           stage, put, len);
  die(n, where);
}

void axi_pipe_fault_handoff(ax_node *n, int stage, const char *key) {
  const char *s = stage < 0 && key ? strstr(key, "stage-") : NULL;
  long st = stage;
  if (s) {
    char *end;
    st = strtol(s + 6, &end, 10);
    if (end == s + 6)
      st = -1;
  }
  if (!match(n, P_HANDOFF, AXI_PIPE_FAULT_F, st, -1, -1))
    return;
  char where[200];
  snprintf(where, sizeof where, "the handoff of stage %ld's state", st);
  die(n, where);
}
