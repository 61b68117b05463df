/* Pooled receive buffers (see rpc/pool-impl.h).
 *
 * Size classes are powers of two from 64 KiB to 1 GiB; each class caches a
 * few free buffers, and the whole cache is capped so that an idle process
 * does not hold much more than its largest recent messages. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "axon/rpc/pool-impl.h"

#define MIN_SHIFT 16 /* 64 KiB */
#define MAX_SHIFT 30 /* 1 GiB */
#define NCLASS (MAX_SHIFT - MIN_SHIFT + 1)
#define PER_CLASS 4                   /* cached buffers per class */
#define CACHE_CAP ((size_t)512 << 20) /* cached bytes in all classes */

typedef struct pbuf {
  struct pbuf *next;
} pbuf;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pbuf *g_free[NCLASS];
static int g_nfree[NCLASS];
static size_t g_cached;
static long g_out;

long axi_pool_outstanding(void) {
  return __atomic_load_n(&g_out, __ATOMIC_RELAXED);
}

static int class_of(size_t n) {
  int c = 0;
  while (((size_t)1 << (MIN_SHIFT + c)) < n)
    c++;
  return c;
}

/* Fresh large buffers ask for transparent huge pages before the first
 * write, which cuts page faults 512-fold on virtual machines. */
static void *buf_alloc(size_t sz) {
  void *p = NULL;
  size_t align = sz >= ((size_t)4 << 20) ? ((size_t)2 << 20) : 64;
  if (posix_memalign(&p, align, sz) != 0)
    return NULL;
  if (align > 64)
    madvise(p, sz, MADV_HUGEPAGE);
  return p;
}

static void buf_release(void *ctx, void *data) {
  int c = (int)(intptr_t)ctx;
  size_t sz = (size_t)1 << (MIN_SHIFT + c);
  __atomic_sub_fetch(&g_out, 1, __ATOMIC_RELAXED);
  pthread_mutex_lock(&g_mu);
  if (g_nfree[c] < PER_CLASS && g_cached + sz <= CACHE_CAP) {
    pbuf *b = data;
    b->next = g_free[c];
    g_free[c] = b;
    g_nfree[c]++;
    g_cached += sz;
    data = NULL;
  }
  pthread_mutex_unlock(&g_mu);
  free(data);
}

ax_tensor *axi_pool_tensor(ax_dtype dtype, int ndim, const int64_t *shape,
                           ax_device dev) {
  size_t bytes = ax_dtype_size(dtype);
  for (int i = 0; i < ndim && ndim <= AX_MAX_DIMS && bytes; i++) {
    if (shape[i] < 0 || (shape[i] && bytes > SIZE_MAX / (size_t)shape[i]))
      bytes = 0; /* let ax_tensor_new report the bad shape */
    else
      bytes *= (size_t)shape[i];
  }
  if (dev.type != AX_DEV_CPU || ndim < 0 || ndim > AX_MAX_DIMS ||
      bytes < AXI_POOL_MIN_BYTES || bytes > ((size_t)1 << MAX_SHIFT))
    return ax_tensor_new(dtype, ndim, shape, dev);
  int c = class_of(bytes);
  pthread_mutex_lock(&g_mu);
  pbuf *b = g_free[c];
  if (b) {
    g_free[c] = b->next;
    g_nfree[c]--;
    g_cached -= (size_t)1 << (MIN_SHIFT + c);
  }
  pthread_mutex_unlock(&g_mu);
  void *p = b ? (void *)b : buf_alloc((size_t)1 << (MIN_SHIFT + c));
  if (!p) {
    ax_seterr(AX_ENOMEM, "pool: cannot allocate %zu bytes", bytes);
    return NULL;
  }
  __atomic_add_fetch(&g_out, 1, __ATOMIC_RELAXED);
  ax_tensor *t = ax_tensor_from_blob(dtype, ndim, shape, dev, p, buf_release,
                                     (void *)(intptr_t)c);
  if (!t)
    buf_release((void *)(intptr_t)c, p); /* from_blob left it to us */
  return t;
}

void axi_pool_trim(void) {
  pbuf *lists[NCLASS];
  pthread_mutex_lock(&g_mu);
  memcpy(lists, g_free, sizeof lists);
  memset(g_free, 0, sizeof g_free);
  memset(g_nfree, 0, sizeof g_nfree);
  g_cached = 0;
  pthread_mutex_unlock(&g_mu);
  for (int c = 0; c < NCLASS; c++)
    for (pbuf *b = lists[c], *nx; b; b = nx) {
      nx = b->next;
      free(b);
    }
}
