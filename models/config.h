/* Small key=value configurations, e.g. "widths=784/256/10,dropout=0.1".
 * Pairs are separated by ',', lists inside a value by '/'. Used for model,
 * data-set and optimizer settings on the command line and, later, for
 * creating remote modules by name. Not thread-safe for writing. */
#ifndef AX_CONFIG_H
#define AX_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#define AX_CONFIG_MAX 32

typedef struct ax_config {
  int n;
  char key[AX_CONFIG_MAX][32];
  char val[AX_CONFIG_MAX][128];
} ax_config;

/* Parses s (NULL or "" gives an empty config). Later keys override earlier
 * ones. AX_EINVAL on a pair without '=' or a key/value that is too long. */
int ax_config_parse(ax_config *c, const char *s);
/* Sets or replaces one key. */
int ax_config_set(ax_config *c, const char *key, const char *val);
/* Merges src into dst (src wins). */
int ax_config_merge(ax_config *dst, const ax_config *src);
const char *ax_config_str(const ax_config *c, const char *key,
                          const char *dflt);
int ax_config_has(const ax_config *c, const char *key);
/* Typed getters return dflt when the key is absent. A value that does not
 * parse stores AX_EINVAL in *err (when err is not NULL) and returns dflt. */
int64_t ax_config_int(const ax_config *c, const char *key, int64_t dflt,
                      int *err);
double ax_config_float(const ax_config *c, const char *key, double dflt,
                       int *err);
/* A '/'-separated integer list; returns the count (at most max), or -1 with
 * AX_EINVAL in *err on a bad entry. Absent key: 0. */
int ax_config_ints(const ax_config *c, const char *key, int64_t *out, int max,
                   int *err);
/* Known keys: while a recorder is set on this thread, every key a getter
 * asks for (present or not) is noted in it, so that a program can run a
 * parser once and then refuse keys it never asked for. */
typedef struct ax_config_keys {
  int n;
  char key[64][32];
} ax_config_keys;
/* Sets (or, with NULL, clears) this thread's recorder. */
void ax_config_record(ax_config_keys *rec);
/* AX_EINVAL, naming `what`, the first key of c the recorder never saw and
 * every key it did ("unknown model-config key 'x' (known: a, b)"). */
int ax_config_check_known(const ax_config *c, const ax_config_keys *rec,
                          const char *what);

/* Writes "k=v,k=v" into buf; returns buf. */
char *ax_config_format(const ax_config *c, char *buf, size_t len);

#endif
