#include "axon/models/config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/error.h"

int ax_config_set(ax_config *c, const char *key, const char *val) {
  if (strlen(key) >= sizeof c->key[0] || strlen(val) >= sizeof c->val[0])
    return ax_seterr(AX_EINVAL, "config: '%s' too long", key);
  for (int i = 0; i < c->n; i++)
    if (strcmp(c->key[i], key) == 0) {
      strcpy(c->val[i], val);
      return AX_OK;
    }
  if (c->n >= AX_CONFIG_MAX)
    return ax_seterr(AX_EINVAL, "config: more than %d keys", AX_CONFIG_MAX);
  strcpy(c->key[c->n], key);
  strcpy(c->val[c->n], val);
  c->n++;
  return AX_OK;
}

int ax_config_parse(ax_config *c, const char *s) {
  memset(c, 0, sizeof *c);
  if (!s || !*s)
    return AX_OK;
  char *dup = strdup(s), *save = NULL;
  if (!dup)
    return AX_ENOMEM;
  int rc = AX_OK;
  for (char *tok = strtok_r(dup, ",", &save); tok && rc == AX_OK;
       tok = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(tok, '=');
    if (!eq || eq == tok) {
      rc = ax_seterr(AX_EINVAL, "config: '%s' is not key=value", tok);
      break;
    }
    *eq = '\0';
    rc = ax_config_set(c, tok, eq + 1);
  }
  free(dup);
  return rc;
}

int ax_config_merge(ax_config *dst, const ax_config *src) {
  for (int i = 0; i < src->n; i++)
    AX_TRY(ax_config_set(dst, src->key[i], src->val[i]));
  return AX_OK;
}

static __thread ax_config_keys *t_rec;

void ax_config_record(ax_config_keys *rec) { t_rec = rec; }

static void note(const char *key) {
  ax_config_keys *r = t_rec;
  if (!r || strlen(key) >= sizeof r->key[0])
    return;
  for (int i = 0; i < r->n; i++)
    if (!strcmp(r->key[i], key))
      return;
  if (r->n < (int)(sizeof r->key / sizeof r->key[0]))
    strcpy(r->key[r->n++], key);
}

int ax_config_check_known(const ax_config *c, const ax_config_keys *rec,
                          const char *what) {
  for (int i = 0; i < c->n; i++) {
    int known = 0;
    for (int k = 0; k < rec->n && !known; k++)
      known = !strcmp(c->key[i], rec->key[k]);
    if (known)
      continue;
    char list[1024] = "";
    size_t len = 0;
    for (int k = 0; k < rec->n && len < sizeof list; k++)
      len += (size_t)snprintf(list + len, sizeof list - len, "%s%s",
                              k ? ", " : "", rec->key[k]);
    return ax_seterr(AX_EINVAL, "unknown %s key '%s' (known: %s)", what,
                     c->key[i], rec->n ? list : "none");
  }
  return AX_OK;
}

const char *ax_config_str(const ax_config *c, const char *key,
                          const char *dflt) {
  note(key);
  for (int i = 0; c && i < c->n; i++)
    if (strcmp(c->key[i], key) == 0)
      return c->val[i];
  return dflt;
}

int ax_config_has(const ax_config *c, const char *key) {
  return ax_config_str(c, key, NULL) != NULL;
}

int64_t ax_config_int(const ax_config *c, const char *key, int64_t dflt,
                      int *err) {
  const char *v = ax_config_str(c, key, NULL);
  if (!v)
    return dflt;
  char *end;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (errno || end == v || *end) {
    if (err)
      *err = ax_seterr(AX_EINVAL, "config: %s=%s is not an integer", key, v);
    return dflt;
  }
  return x;
}

double ax_config_float(const ax_config *c, const char *key, double dflt,
                       int *err) {
  const char *v = ax_config_str(c, key, NULL);
  if (!v)
    return dflt;
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || end == v || *end) {
    if (err)
      *err = ax_seterr(AX_EINVAL, "config: %s=%s is not a number", key, v);
    return dflt;
  }
  return x;
}

int ax_config_ints(const ax_config *c, const char *key, int64_t *out, int max,
                   int *err) {
  const char *v = ax_config_str(c, key, NULL);
  if (!v)
    return 0;
  int n = 0;
  const char *p = v;
  while (*p) {
    char *end;
    long long x = strtoll(p, &end, 10);
    if (end == p || (*end && *end != '/') || n >= max) {
      if (err)
        *err = ax_seterr(AX_EINVAL,
                         "config: %s=%s is not a list of at most "
                         "%d integers",
                         key, v, max);
      return -1;
    }
    out[n++] = x;
    p = *end ? end + 1 : end;
  }
  return n;
}

char *ax_config_format(const ax_config *c, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  for (int i = 0; i < c->n && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, "%s%s=%s", i ? "," : "", c->key[i],
                          c->val[i]);
  return buf;
}
