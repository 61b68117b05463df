/* The command lines of axon-agent, axon-run and axon-bench: checks of
 * numeric flags and HOST:PORT addresses, and the one option parser. Every
 * program describes each of its commands by a table of options (one row
 * per option: name, argument kind, destination field, allowed range or
 * values, help text); axi_cli_parse reads a command line through that
 * table into the command's options struct, and axi_cli_help writes the
 * command's help from it. Each failure prints a clear message naming the
 * program and the flag; the caller exits with the status returned (2 for
 * bad input). Compiled into every program (agents/axon_cli.c). */
#ifndef AX_AGENT_CLI_H
#define AX_AGENT_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Parses a whole decimal integer in [lo, hi] (an optional K/M/G suffix
 * multiplies by 2^10/2^20/2^30 when `units` is set) into *out. 1, or 0
 * after a message on stderr. */
int axi_cli_int(const char *prog, const char *flag, const char *s, int64_t lo,
                int64_t hi, int units, int64_t *out);
/* The same into an int. */
int axi_cli_i32(const char *prog, const char *flag, const char *s, int lo,
                int hi, int *out);
/* Checks a HOST:PORT address: a non-empty host and a port in
 * [min_port, 65535]. 1, or 0 after a message. */
int axi_cli_hostport(const char *prog, const char *flag, const char *s,
                     int min_port);

/* What an option's argument is and where it goes (`off`: the offset of
 * the destination field in the command's options struct). */
typedef enum axi_cli_kind {
  AXI_CLI_TEXT,     /* not an option: a line of the help (name NULL) */
  AXI_CLI_FLAG,     /* no argument: the int is set to 1 */
  AXI_CLI_STR,      /* const char *: the argument itself */
  AXI_CLI_INT,      /* int in [lo, hi] */
  AXI_CLI_I64,      /* int64_t (or uint64_t) in [lo, hi] */
  AXI_CLI_LONG,     /* long in [lo, hi] */
  AXI_CLI_SIZE,     /* size_t in [lo, hi] */
  AXI_CLI_DOUBLE,   /* double from lo to hi (hi INT64_MAX: no upper bound;
                       the ends are open with AXI_CLI_OPEN_LO/HI) */
  AXI_CLI_HOSTPORT, /* const char *: HOST:PORT with a port from lo */
  AXI_CLI_CHOICE,   /* int: the index of the argument in `values` */
  AXI_CLI_DEVICE,   /* ax_device: a device that exists here */
  AXI_CLI_FN        /* parsed by fn */
} axi_cli_kind;

/* Flags of a row. */
#define AXI_CLI_UNITS 1u   /* integers take a K, M or G suffix */
#define AXI_CLI_OPEN_LO 2u /* a double must be > lo (else >= lo) */
#define AXI_CLI_OPEN_HI 4u /* a double must be < hi (else <= hi) */

/* One option (or, with kind AXI_CLI_TEXT, one line of help text). */
typedef struct axi_cli_opt {
  const char *name; /* without the "--" */
  const char *arg;  /* the argument's name in the help ("N"); NULL: the
                       option takes none (FLAG) */
  axi_cli_kind kind;
  size_t off;     /* the destination in the command's options struct */
  int64_t lo, hi; /* the allowed range of a number (HOSTPORT: lo = the
                     lowest port) */
  unsigned flags; /* AXI_CLI_UNITS, AXI_CLI_OPEN_LO, AXI_CLI_OPEN_HI */
  /* CHOICE: the allowed values, "a|b|c"; with values_fn (the list known
   * at run time), what the help shows in place of "%s". */
  const char *values;
  const char *(*values_fn)(void);
  /* FN: parses arg into the options struct `dst`; 0, or the exit status
   * after a message on stderr. */
  int (*fn)(void *dst, const char *arg);
  /* The help text, lines separated by "\n" (NULL: not listed; TEXT: the
   * line itself). */
  const char *help;
} axi_cli_opt;

/* The end of a table. */
#define AXI_CLI_END                                                            \
  { NULL, NULL, AXI_CLI_TEXT, 0, 0, 0 }

typedef struct axi_cli_cmd axi_cli_cmd;

/* A command: its options are the rows of `tables` (a NULL-terminated list
 * of tables ended by AXI_CLI_END), plus those of `also` when set. The
 * commands of one `family` fill the same options struct and see each
 * other's options: one of another command of the family is refused by
 * name ("--iters is an option of axon-run probe"). */
struct axi_cli_cmd {
  const char *name;  /* NULL: the program has no commands */
  const char *usage; /* after "usage: PROG NAME " (lines separated by
                        "\n") */
  const char *about; /* the paragraph after the usage (may be NULL) */
  const axi_cli_opt *const *tables;
  const axi_cli_cmd *also;
  int family;
  int (*main)(int argc, char **argv); /* runs it; the exit status */
};

/* A program and its commands. */
typedef struct axi_cli_prog {
  const char *name; /* "axon-run" */
  const axi_cli_cmd *const *cmds;
  int ncmds;
  int col;            /* where the help texts start */
  const char *shorts; /* getopt's short options: "h" (for -h) or "" */
} axi_cli_prog;

/* Parses argv[first..argc) for command c of program p into the options
 * struct dst, row after row in the command line's order (a row's parse
 * may depend on those before it). Returns -1 when the command goes on;
 * else the exit status: 0 after --help (the help on stdout), 2 after a
 * message on bad input (an unknown option also writes the help to
 * stderr), or the status an FN row returned. */
int axi_cli_parse(const axi_cli_prog *p, const axi_cli_cmd *c, int first,
                  int argc, char **argv, void *dst);

/* Writes the help of command c, generated from its table, to f. */
void axi_cli_help(const axi_cli_prog *p, const axi_cli_cmd *c, FILE *f);

/* Runs the command argv[1] names from p's table of commands (its main);
 * with no command or -h/--help, writes `intro` and every command's help
 * (to stderr and 2 without a command, else stdout and 0); an unknown
 * command is refused with 2. */
int axi_cli_dispatch(const axi_cli_prog *p, const char *intro, int argc,
                     char **argv);

#endif
