#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/kernels/backend-impl.h"
#include "axon/kernels/error.h"

static pthread_mutex_t backends_lock = PTHREAD_MUTEX_INITIALIZER;
static ax_backend cpu_backend;
static int cpu_ready;
static ax_backend cuda_backends[AX_MAX_CUDA_DEVICES];
static int cuda_ready[AX_MAX_CUDA_DEVICES];

int ax_device_parse(const char *s, ax_device *out) {
  if (!s)
    return ax_seterr(AX_EINVAL, "device: missing name");
  if (strcmp(s, "cpu") == 0) {
    *out = AX_CPU;
    return AX_OK;
  }
  if (strcmp(s, "cuda") == 0) {
    *out = (ax_device){AX_DEV_CUDA, 0};
    return AX_OK;
  }
  if (strncmp(s, "cuda:", 5) == 0) {
    char *end;
    long i = strtol(s + 5, &end, 10);
    if (*end == '\0' && end != s + 5 && i >= 0 && i < AX_MAX_CUDA_DEVICES) {
      *out = (ax_device){AX_DEV_CUDA, (int)i};
      return AX_OK;
    }
  }
  return ax_seterr(AX_EINVAL, "device: '%s' is not cpu, cuda or cuda:N", s);
}

char *ax_device_str(ax_device d, char *buf, size_t len) {
  if (d.type == AX_DEV_CPU)
    snprintf(buf, len, "cpu");
  else
    snprintf(buf, len, "cuda:%d", d.index);
  return buf;
}

int ax_device_eq(ax_device a, ax_device b) {
  return a.type == b.type && (a.type == AX_DEV_CPU || a.index == b.index);
}

int ax_device_check(ax_device d) {
  char b[16];
  if (d.type == AX_DEV_CPU)
    return AX_OK;
  if (d.type != AX_DEV_CUDA || d.index < 0)
    return ax_seterr(AX_ENODEV, "device: unknown device type %d", (int)d.type);
  int n = ax_cuda_device_count();
  const char *why = n ? NULL : axi_cuda_load_error();
  if (d.index >= n)
    return ax_seterr(
        AX_ENODEV, "%s: no such device (%d CUDA device%s here%s%s)",
        ax_device_str(d, b, sizeof b), n, n == 1 ? "" : "s",
        why ? "; the CUDA backend cannot be loaded: " : "", why ? why : "");
  return AX_OK;
}

/* ---- device maps --------------------------------------------------------- */

/* Reads one device name at *p ("cpu", "cuda", "cuda:N") and advances *p past
 * it. A ':' after "cuda" belongs to the name only when a digit follows. */
static int map_device(const char **p, ax_device *out) {
  const char *s = *p;
  char name[24];
  size_t k = 0;
  if (!strncmp(s, "cpu", 3))
    k = 3;
  else if (!strncmp(s, "cuda", 4)) {
    k = 4;
    if (s[4] == ':' && s[5] >= '0' && s[5] <= '9')
      for (k = 5; s[k] >= '0' && s[k] <= '9' && k < sizeof name - 1; k++)
        ;
  }
  if (k == 0 || (s[k] >= '0' && s[k] <= '9'))
    return AX_EINVAL;
  memcpy(name, s, k);
  name[k] = 0;
  AX_TRY(ax_device_parse(name, out));
  *p = s + k;
  return AX_OK;
}

int ax_device_map_parse(const char *s, ax_device_map *out) {
  memset(out, 0, sizeof *out);
  const char *p = s ? s : "";
  while (*p) {
    const char *entry = p;
    ax_device src, dst;
    char b[16];
    int ok = map_device(&p, &src) == AX_OK && (*p == '=' || *p == ':');
    if (ok) {
      p++;
      ok = map_device(&p, &dst) == AX_OK && (!*p || (*p == ',' && p[1]));
    }
    if (!ok) {
      memset(out, 0, sizeof *out);
      return ax_seterr(AX_EINVAL,
                       "device map: bad entry at '%s' (want "
                       "SRC=DST[,SRC=DST...], devices cpu, cuda or cuda:N)",
                       entry);
    }
    for (int i = 0; i < out->n; i++)
      if (ax_device_eq(out->src[i], src)) {
        memset(out, 0, sizeof *out);
        return ax_seterr(AX_EINVAL, "device map: %s mapped twice",
                         ax_device_str(src, b, sizeof b));
      }
    out->src[out->n] = src; /* at most one entry per source: always room */
    out->dst[out->n++] = dst;
    p += *p == ',';
  }
  return AX_OK;
}

int ax_device_map_check(const ax_device_map *m) {
  for (int i = 0; m && i < m->n; i++)
    if (ax_device_check(m->dst[i]) != AX_OK) {
      char msg[256], a[16], b[16];
      snprintf(msg, sizeof msg, "%s", ax_errmsg());
      return ax_seterr(AX_ENODEV, "device map entry %s=%s: %s",
                       ax_device_str(m->src[i], a, sizeof a),
                       ax_device_str(m->dst[i], b, sizeof b), msg);
    }
  return AX_OK;
}

ax_device ax_device_map_lookup(const ax_device_map *m, ax_device src,
                               ax_device dflt) {
  for (int i = 0; m && i < m->n; i++)
    if (ax_device_eq(m->src[i], src))
      return m->dst[i];
  return dflt;
}

char *ax_device_map_str(const ax_device_map *m, char *buf, size_t len) {
  size_t o = 0;
  if (len)
    buf[0] = 0;
  for (int i = 0; m && i < m->n && o < len; i++) {
    char a[16], b[16];
    o += (size_t)snprintf(buf + o, len - o, "%s%s=%s", i ? "," : "",
                          ax_device_str(m->src[i], a, sizeof a),
                          ax_device_str(m->dst[i], b, sizeof b));
  }
  return buf;
}

int ax_backend_get(ax_device d, ax_backend **out) {
  int rc = AX_OK;
  pthread_mutex_lock(&backends_lock);
  if (d.type == AX_DEV_CPU) {
    if (!cpu_ready && (rc = axi_cpu_backend_init(&cpu_backend)) == AX_OK)
      cpu_ready = 1;
    *out = &cpu_backend;
  } else if (d.type == AX_DEV_CUDA && d.index >= 0 &&
             d.index < AX_MAX_CUDA_DEVICES) {
    if (!cuda_ready[d.index] &&
        (rc = axi_cuda_backend_init(&cuda_backends[d.index], d.index)) == AX_OK)
      cuda_ready[d.index] = 1;
    *out = &cuda_backends[d.index];
  } else {
    rc = ax_seterr(AX_ENODEV, "device: unknown device type %d", (int)d.type);
  }
  pthread_mutex_unlock(&backends_lock);
  if (rc != AX_OK)
    *out = NULL;
  return rc;
}

ax_backend *ax_backend_of(ax_device d) {
  ax_backend *be = NULL;
  ax_backend_get(d, &be);
  return be;
}

int ax_device_synchronize(ax_device d) {
  ax_backend *be;
  AX_TRY(ax_backend_get(d, &be));
  return AX_K(be, synchronize);
}

int ax_cuda_device_count(void) { return axi_cuda_device_count(); }

int ax_conv_desc_init(ax_conv_desc *d) {
  if (d->n <= 0 || d->c <= 0 || d->h <= 0 || d->w <= 0 || d->k <= 0 ||
      d->r <= 0 || d->s <= 0 || d->stride <= 0 || d->pad < 0)
    return ax_seterr(AX_EINVAL, "conv: bad geometry");
  int span_h = d->h + 2 * d->pad - d->r, span_w = d->w + 2 * d->pad - d->s;
  d->oh = span_h < 0 ? 0 : span_h / d->stride + 1;
  d->ow = span_w < 0 ? 0 : span_w / d->stride + 1;
  if (d->oh <= 0 || d->ow <= 0)
    return ax_seterr(AX_ESHAPE, "conv: %dx%d input too small for %dx%d filter",
                     d->h, d->w, d->r, d->s);
  return AX_OK;
}

int ax_pool_desc_init(ax_pool_desc *d) {
  if (d->n <= 0 || d->c <= 0 || d->h <= 0 || d->w <= 0 || d->kh <= 0 ||
      d->kw <= 0 || d->stride <= 0 || d->pad < 0 || 2 * d->pad > d->kh ||
      2 * d->pad > d->kw)
    return ax_seterr(AX_EINVAL, "pool: bad geometry");
  int span_h = d->h + 2 * d->pad - d->kh, span_w = d->w + 2 * d->pad - d->kw;
  d->oh = span_h < 0 ? 0 : span_h / d->stride + 1;
  d->ow = span_w < 0 ? 0 : span_w / d->stride + 1;
  if (d->oh <= 0 || d->ow <= 0)
    return ax_seterr(AX_ESHAPE, "pool: %dx%d input too small for %dx%d window",
                     d->h, d->w, d->kh, d->kw);
  return AX_OK;
}

int ax_attn_desc_check(const ax_attn_desc *d, const char *fn) {
  if (d->b < 0 || d->heads <= 0 || d->dh <= 0 || d->sq < 0 || d->sk <= 0 ||
      d->sq > d->sk || d->head0 < 0 || d->heads_total < d->head0 + d->heads ||
      !(d->dropout >= 0.0f && d->dropout < 1.0f))
    return ax_seterr(AX_EINVAL,
                     "%s: bad geometry (b %d, heads %d of %d from %d, sq %d, "
                     "sk %d, dh %d, dropout %g)",
                     fn, d->b, d->heads, d->heads_total, d->head0, d->sq, d->sk,
                     d->dh, (double)d->dropout);
  return AX_OK;
}
