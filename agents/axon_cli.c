/* The programs' option parser and help writer; see agents/axon_cli.h. */
#include "agents/axon_cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/device.h"
#include "axon/kernels/error.h"

int axi_cli_int(const char *prog, const char *flag, const char *s, int64_t lo,
                int64_t hi, int units, int64_t *out) {
  char *end = NULL;
  errno = 0;
  long long v = s ? strtoll(s, &end, 10) : 0;
  int shift = 0;
  if (units && end && *end && !end[1]) {
    shift = *end == 'K' || *end == 'k'   ? 10
            : *end == 'M' || *end == 'm' ? 20
            : *end == 'G' || *end == 'g' ? 30
                                         : -1;
    if (shift > 0)
      end++;
  }
  int ok = s && *s && end != s && !*end && errno != ERANGE && shift >= 0 &&
           (shift == 0 || (v >= 0 && v <= (INT64_MAX >> shift)));
  if (ok && shift) /* v >= 0 here: shifting a negative value is undefined */
    v = (long long)((int64_t)v << shift);
  if (!ok || v < lo || v > hi) {
    fprintf(stderr, "%s: %s %s: expected an integer from %lld to %lld\n", prog,
            flag, s ? s : "(none)", (long long)lo, (long long)hi);
    return 0;
  }
  *out = v;
  return 1;
}

int axi_cli_i32(const char *prog, const char *flag, const char *s, int lo,
                int hi, int *out) {
  int64_t v;
  if (!axi_cli_int(prog, flag, s, lo, hi, 0, &v))
    return 0;
  *out = (int)v;
  return 1;
}

int axi_cli_hostport(const char *prog, const char *flag, const char *s,
                     int min_port) {
  const char *c = s ? strrchr(s, ':') : NULL;
  int64_t port;
  if (!c || c == s) {
    fprintf(stderr, "%s: %s %s: expected HOST:PORT\n", prog, flag,
            s ? s : "(none)");
    return 0;
  }
  return axi_cli_int(prog, flag, c + 1, min_port, 65535, 0, &port);
}

/* A double from r's lo to hi (open or closed ends) into *out. */
static int parse_double(const char *prog, const axi_cli_opt *r, const char *s,
                        double *out) {
  char *end;
  double x = strtod(s, &end), lo = (double)r->lo, hi = (double)r->hi;
  int open_lo = r->flags & AXI_CLI_OPEN_LO,
      open_hi = r->flags & AXI_CLI_OPEN_HI;
  int bounded = r->hi != INT64_MAX;
  if (end != s && !*end && (open_lo ? x > lo : x >= lo) &&
      (!bounded || (open_hi ? x < hi : x <= hi))) {
    *out = x;
    return 1;
  }
  if (bounded)
    fprintf(stderr, "%s: --%s '%s': expected a number in %c%lld, %lld%c\n",
            prog, r->name, s, open_lo ? '(' : '[', (long long)r->lo,
            (long long)r->hi, open_hi ? ')' : ']');
  else
    fprintf(stderr, "%s: --%s '%s': expected a number %s %lld\n", prog, r->name,
            s, open_lo ? ">" : ">=", (long long)r->lo);
  return 0;
}

/* The index of s among the '|'-separated values, or -1. */
static int choice(const char *values, const char *s) {
  size_t n = strlen(s);
  int i = 0;
  for (const char *v = values; v; v = strchr(v, '|'), i++) {
    v += *v == '|';
    if (!strncmp(v, s, n) && (v[n] == '|' || !v[n]))
      return i;
  }
  return -1;
}

/* Reads the argument of row r into dst: 0, or the exit status after a
 * message. */
static int parse_row(const char *prog, const axi_cli_opt *r, void *dst,
                     const char *s) {
  char flag[80];
  snprintf(flag, sizeof flag, "--%s", r->name);
  void *p = (char *)dst + r->off;
  int64_t v = 0;
  int units = (r->flags & AXI_CLI_UNITS) != 0;
  switch (r->kind) {
  case AXI_CLI_FLAG:
    *(int *)p = 1;
    return 0;
  case AXI_CLI_STR:
    *(const char **)p = s;
    return 0;
  case AXI_CLI_HOSTPORT:
    *(const char **)p = s;
    return axi_cli_hostport(prog, flag, s, (int)r->lo) ? 0 : 2;
  case AXI_CLI_DOUBLE:
    return parse_double(prog, r, s, p) ? 0 : 2;
  case AXI_CLI_CHOICE:
    if ((*(int *)p = choice(r->values, s)) >= 0)
      return 0;
    fprintf(stderr, "%s: %s %s\n", prog, flag, r->values);
    return 2;
  case AXI_CLI_DEVICE:
    if (ax_device_parse(s, p) != AX_OK) {
      fprintf(stderr, "%s: %s\n", prog, ax_errmsg());
      return 2;
    }
    if (ax_device_check(*(ax_device *)p) != AX_OK) {
      fprintf(stderr, "%s: %s %s does not exist here: %s\n", prog, flag, s,
              ax_errmsg());
      return 2;
    }
    return 0;
  case AXI_CLI_FN:
    return r->fn(dst, s);
  default: /* the integers */
    if (!axi_cli_int(prog, flag, s, r->lo, r->hi, units, &v))
      return 2;
    if (r->kind == AXI_CLI_INT)
      *(int *)p = (int)v;
    else if (r->kind == AXI_CLI_LONG)
      *(long *)p = (long)v;
    else if (r->kind == AXI_CLI_SIZE)
      *(size_t *)p = (size_t)v;
    else
      *(int64_t *)p = v;
    return 0;
  }
}

/* Row `name` of command c (its own tables, then those of c->also), or
 * NULL. */
static const axi_cli_opt *find(const axi_cli_cmd *c, const char *name) {
  for (; c; c = c->also)
    for (const axi_cli_opt *const *t = c->tables; t && *t; t++)
      for (const axi_cli_opt *r = *t; r->name || r->help; r++)
        if (r->name && !strcmp(r->name, name))
          return r;
  return NULL;
}

#define MAX_OPTS 160

/* getopt's val of row r, the n-th option: 256 + the index of the first
 * option that fills the same field the same way (two names of one option,
 * as --join-timeout and --join-timeout-ms, so that a prefix of both is
 * not ambiguous), else 256 + n. */
static int opt_val(const axi_cli_opt *const *rows, int n) {
  const axi_cli_opt *r = rows[n];
  for (int j = 0; j < n && r->kind != AXI_CLI_FN; j++)
    if (rows[j]->kind == r->kind && rows[j]->off == r->off &&
        !rows[j]->arg == !r->arg)
      return 256 + j;
  return 256 + n;
}

/* getopt's table: every option of c's family, once each (names[i] the
 * name of val 256 + i); the help last. */
static void long_opts(const axi_cli_prog *p, const axi_cli_cmd *c,
                      struct option *lo) {
  const axi_cli_opt *rows[MAX_OPTS];
  int n = 0;
  for (int i = 0; i < p->ncmds; i++) {
    if (p->cmds[i]->family != c->family)
      continue;
    for (const axi_cli_cmd *k = p->cmds[i]; k; k = k->also)
      for (const axi_cli_opt *const *t = k->tables; t && *t; t++)
        for (const axi_cli_opt *r = *t; r->name || r->help; r++) {
          int dup = !r->name;
          for (int j = 0; j < n && !dup; j++)
            dup = !strcmp(lo[j].name, r->name);
          if (!dup && n < MAX_OPTS) {
            rows[n] = r;
            lo[n] =
                (struct option){r->name, r->arg ? 1 : 0, 0, opt_val(rows, n)};
            n++;
          }
        }
  }
  lo[n++] = (struct option){"help", 0, 0, 'h'};
  lo[n] = (struct option){0, 0, 0, 0};
}

/* Refuses option `name`, which c does not take: the command of its family
 * that does is named. Returns 2. */
static int foreign(const axi_cli_prog *p, const axi_cli_cmd *c,
                   const char *name) {
  for (int i = 0; i < p->ncmds; i++)
    if (p->cmds[i]->family == c->family && find(p->cmds[i], name)) {
      fprintf(stderr, "%s: --%s is an option of %s %s\n", p->name, name,
              p->name, p->cmds[i]->name);
      break;
    }
  return 2;
}

int axi_cli_parse(const axi_cli_prog *p, const axi_cli_cmd *c, int first,
                  int argc, char **argv, void *dst) {
  static struct option lo[MAX_OPTS + 2];
  long_opts(p, c, lo);
  optind = first;
  int k, at = 0, rc = -1;
  while (rc < 0 && (k = getopt_long(argc, argv, p->shorts, lo, &at)) != -1) {
    if (k == 'h') {
      axi_cli_help(p, c, stdout);
      return 0;
    }
    if (k < 256) { /* getopt said what is wrong */
      axi_cli_help(p, c, stderr);
      return 2;
    }
    const axi_cli_opt *r = find(c, lo[at].name); /* the name given */
    rc = r ? parse_row(p->name, r, dst, optarg) : foreign(p, c, lo[at].name);
    rc = rc == 0 ? -1 : rc;
  }
  if (rc < 0 && optind != argc) {
    fprintf(stderr, "%s: unexpected argument '%s' (try --help)\n", p->name,
            argv[optind]);
    return 2;
  }
  return rc;
}

/* Writes text, its lines after the first indented by col, and a newline;
 * "%s" in it stands for `values`. */
static void put_text(FILE *f, const char *text, const char *values, int col) {
  const char *pct = values ? strstr(text, "%s") : NULL;
  for (const char *s = text; *s; s++) {
    if (s == pct) {
      fputs(values, f);
      s++;
    } else {
      fputc(*s, f);
      if (*s == '\n')
        fprintf(f, "%*s", col, "");
    }
  }
  fputc('\n', f);
}

/* One option's lines: "  --name ARG" and its help from column col. */
static void put_row(FILE *f, const axi_cli_opt *r, int col) {
  int w = fprintf(f, "  --%s%s%s", r->name, r->arg ? " " : "",
                  r->arg ? r->arg : "");
  if (w < col)
    fprintf(f, "%*s", col - w, "");
  else
    fprintf(f, "\n%*s", col, "");
  put_text(f, r->help, r->values_fn ? r->values_fn() : r->values, col);
}

void axi_cli_help(const axi_cli_prog *p, const axi_cli_cmd *c, FILE *f) {
  int w = fprintf(f, "usage: %s%s%s ", p->name, c->name ? " " : "",
                  c->name ? c->name : "");
  put_text(f, c->usage, NULL, w);
  if (c->about) {
    fputc('\n', f);
    put_text(f, c->about, NULL, 0);
  }
  fputc('\n', f);
  for (const axi_cli_opt *const *t = c->tables; t && *t; t++)
    for (const axi_cli_opt *r = *t; r->name || r->help; r++)
      if (!r->name)
        put_text(f, r->help, NULL, 0);
      else if (r->help)
        put_row(f, r, p->col);
  if (c->also)
    fprintf(f, "  and every option of %s %s (%s %s --help)\n", p->name,
            c->also->name, p->name, c->also->name);
  w = fprintf(f, "  %s--help", strchr(p->shorts, 'h') ? "-h, " : "");
  fprintf(f, "%*sthis text\n", w < p->col ? p->col - w : 1, "");
}

int axi_cli_dispatch(const axi_cli_prog *p, const char *intro, int argc,
                     char **argv) {
  if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
    FILE *f = argc < 2 ? stderr : stdout;
    fputs(intro, f);
    for (int i = 0; i < p->ncmds; i++) {
      fputc('\n', f);
      axi_cli_help(p, p->cmds[i], f);
    }
    return argc < 2 ? 2 : 0;
  }
  for (int i = 0; i < p->ncmds; i++)
    if (!strcmp(argv[1], p->cmds[i]->name))
      return p->cmds[i]->main(argc, argv);
  fprintf(stderr, "%s: unknown command '%s' (try --help)\n", p->name, argv[1]);
  return 2;
}
