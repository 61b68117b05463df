/* The shared-memory path of the bulk channel ("shm" data transport): a
 * connection between two nodes of one host is a Unix stream socket plus a
 * ring of shared memory. The dialler (the connection's only writer) makes
 * the ring with memfd_create, seals its size and hands it over with the
 * connection's first byte (SCM_RIGHTS); the acceptor maps it. Frames, the
 * hello included, cross the ring (one copy in, one copy out); the socket
 * carries the authentication's challenge and proof, one-byte doorbells that
 * wake a sleeping side, and the end of the connection (EOF), so the
 * libevent loop and the peer-down rules stay those of TCP.
 *
 * Each side keeps its own index (the writer's head, the reader's tail) in
 * private memory and only publishes it; the other side's index is read from
 * the shared header and checked (never more than the ring's size apart), so
 * a peer scribbling on the header is refused, never trusted. The size is
 * read once and the file is sealed against shrinking, so the mapping can
 * not fault under the reader. A memfd has no name: nothing is left behind
 * when both ends close, whichever dies first. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "axon/rpc/auth-impl.h"
#include "axon/rpc/bulk-impl.h"

#define SHM_MAGIC 0x52535841u  /* "AXSR" */
#define SHM_DATA_OFF 4096u     /* the ring's bytes start one page in */
#define SHM_CHUNK (256u << 10) /* indices are published every chunk */
#define SHM_OFFER 'M'          /* the first byte, carrying the memfd */
#define SHM_BELL 'B'

/* The shared header. Each index and its side's sleeping flag share a cache
 * line; the other side only reads them. */
typedef struct shm_hdr {
  uint32_t magic, version;
  uint64_t size;
  _Alignas(64) _Atomic uint64_t head; /* bytes ever written */
  _Atomic uint32_t reader_sleeping;
  _Alignas(64) _Atomic uint64_t tail; /* bytes ever consumed */
  _Atomic uint32_t writer_sleeping;
} shm_hdr;

struct axi_shm_ring {
  shm_hdr *h;
  uint8_t *data;
  size_t size, map_len; /* size: a power of two, read once */
  uint64_t mine;        /* the writer's head or the reader's tail */
};

/* ---- identity and addresses ---------------------------------------------*/
int axi_shm_host_id(char *out, size_t len) {
  char boot[64] = "";
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (!f || !fgets(boot, sizeof boot, f)) {
    if (f)
      fclose(f);
    return ax_seterr(AX_EIO, "shm: no boot id");
  }
  fclose(f);
  char hex[17];
  size_t k = 0;
  for (const char *s = boot; *s && k < 16; s++)
    if ((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f'))
      hex[k++] = *s;
  hex[k] = 0;
  /* Abstract Unix sockets belong to a network namespace: two nodes in
   * different ones (the test bed's hosts) are different hosts here. */
  struct stat st;
  if (k < 16 || stat("/proc/self/ns/net", &st))
    return ax_seterr(AX_EIO, "shm: no host identity");
  snprintf(out, len, "%s.%llu", hex, (unsigned long long)st.st_ino);
  return AX_OK;
}

/* The abstract socket name of the node whose TCP address is hostport
 * (bound by it, so unique within the namespace). */
static socklen_t sock_name(const char *hostport, struct sockaddr_un *sa) {
  memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  int w = snprintf(sa->sun_path + 1, sizeof sa->sun_path - 1, "axon-shm/%s",
                   hostport);
  if (w < 0 || (size_t)w >= sizeof sa->sun_path - 1)
    return 0;
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)w);
}

int axi_shm_listen_addr(const char *hostport, struct sockaddr_un *sa,
                        socklen_t *len) {
  *len = sock_name(hostport, sa);
  return *len ? AX_OK : ax_seterr(AX_EINVAL, "shm: address too long");
}

int axi_shm_same_host(const char *bulk_addr, const char *host_id) {
  const char *s = bulk_addr ? strstr(bulk_addr, AXI_SHM_SUFFIX) : NULL;
  return s && host_id && *host_id &&
         !strcmp(s + strlen(AXI_SHM_SUFFIX), host_id);
}

/* ---- the ring -----------------------------------------------------------*/
void axi_shm_ring_free(axi_shm_ring *r) {
  if (!r)
    return;
  if (r->h)
    munmap(r->h, r->map_len);
  free(r);
}

static axi_shm_ring *ring_map(int fd, size_t map_len) {
  axi_shm_ring *r = calloc(1, sizeof *r);
  if (!r)
    return NULL;
  void *p = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    free(r);
    return NULL;
  }
  r->h = p;
  r->map_len = map_len;
  r->data = (uint8_t *)p + SHM_DATA_OFF;
  return r;
}

/* Dialling side: a fresh ring of `size` bytes, offered over fd with the
 * connection's first byte. */
int axi_shm_offer(int fd, size_t size, axi_shm_ring **out) {
  int mfd = memfd_create("axon-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (mfd < 0)
    return ax_seterr(AX_EIO, "shm: memfd_create: %s", strerror(errno));
  size_t map_len = SHM_DATA_OFF + size;
  axi_shm_ring *r = NULL;
  int rc = AX_OK;
  if (ftruncate(mfd, (off_t)map_len) ||
      fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) ||
      !(r = ring_map(mfd, map_len))) {
    rc = ax_seterr(AX_EIO, "shm: ring of %zu bytes: %s", size, strerror(errno));
  } else {
    r->size = size;
    r->h->magic = SHM_MAGIC;
    r->h->version = 1;
    r->h->size = size;
    char byte = SHM_OFFER;
    struct iovec iov = {&byte, 1};
    union {
      struct cmsghdr c;
      char buf[CMSG_SPACE(sizeof(int))];
    } u;
    memset(&u, 0, sizeof u);
    struct msghdr mh = {.msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = u.buf,
                        .msg_controllen = sizeof u.buf};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &mfd, sizeof mfd);
    ssize_t w;
    do
      w = sendmsg(fd, &mh, MSG_NOSIGNAL);
    while (w < 0 && errno == EINTR);
    if (w != 1)
      rc = ax_seterr(AX_EPEERDOWN, "shm: cannot hand the ring over: %s",
                     w < 0 ? strerror(errno) : "short write");
  }
  close(mfd); /* the mapping (and the peer's descriptor) keep it */
  if (rc != AX_OK) {
    axi_shm_ring_free(r);
    return rc;
  }
  *out = r;
  return AX_OK;
}

/* Accepting side: takes the offered ring. 1 when mapped, 0 while the byte
 * has not come, -1 to close (EOF, or an offer that is not a sealed ring of
 * a sane size: logged). */
int axi_shm_take(bconn *c) {
  char byte = 0;
  struct iovec iov = {&byte, 1};
  union {
    struct cmsghdr c;
    char buf[CMSG_SPACE(4 * sizeof(int))];
  } u;
  struct msghdr mh = {.msg_iov = &iov,
                      .msg_iovlen = 1,
                      .msg_control = u.buf,
                      .msg_controllen = sizeof u.buf};
  ssize_t r;
  do
    r = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC);
  while (r < 0 && errno == EINTR);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
    return 0;
  int fds[4], nfd = 0;
  for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
      for (size_t i = 0;
           (i + 1) * sizeof(int) <= cm->cmsg_len - CMSG_LEN(0) && nfd < 4; i++)
        memcpy(&fds[nfd++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
  const char *why = NULL;
  struct stat st;
  int seals = nfd == 1 ? fcntl(fds[0], F_GET_SEALS) : -1;
  if (r != 1 || byte != SHM_OFFER || nfd != 1)
    why = r == 0 ? NULL : "no ring offered";
  else if (seals < 0 || !(seals & F_SEAL_SHRINK))
    why = "ring not sealed against shrinking";
  else if (fstat(fds[0], &st) ||
           st.st_size < (off_t)SHM_DATA_OFF + AXI_SHM_MIN ||
           st.st_size > (off_t)SHM_DATA_OFF + AXI_SHM_MAX)
    why = "ring of a bad size";
  axi_shm_ring *ring = NULL;
  if (!why && r == 1) {
    size_t size = (size_t)st.st_size - SHM_DATA_OFF;
    ring = ring_map(fds[0], (size_t)st.st_size);
    if (!ring)
      why = "cannot map the ring";
    else if (ring->h->magic != SHM_MAGIC || ring->h->size != size ||
             (size & (size - 1)))
      why = "ring header does not match its file";
    else
      ring->size = size;
    /* Our tail starts at 0 whatever the header says; the writer's head
     * (the hello may be in already) is checked from here on. */
    if (!why && atomic_load(&ring->h->head) > size)
      why = "ring indices out of range";
  }
  for (int i = 0; i < nfd; i++)
    close(fds[i]);
  if (why || r != 1) {
    axi_shm_ring_free(ring);
    if (why && axi_refusal_logged(c->b->node))
      fprintf(stderr, "axon: %s: refusing a shared-memory connection: %s\n",
              c->b->node->name, why);
    return -1;
  }
  c->ring = ring;
  return 1;
}

static void ring_bell(int fd) {
  char b = SHM_BELL;
  /* A full socket already holds bells: the sleeper wakes either way. */
  while (send(fd, &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno == EINTR)
    ;
}

/* Reads the doorbells (and the EOF) off the socket: -1 once the peer
 * closed it or sent anything but bells, else 0. At most 16 reads a call:
 * a peer that keeps ringing cannot hold the I/O thread (the event is
 * level-triggered: what is left comes back). A short read emptied the
 * socket, so the usual single bell costs one read, not a second that
 * fails with EAGAIN. */
int axi_shm_drain(bconn *c) {
  char buf[256];
  for (int i = 0; i < 16; i++) {
    ssize_t r = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
    for (ssize_t k = 0; k < r; k++)
      if (buf[k] != SHM_BELL)
        return -1;
    if (r > 0 && (size_t)r < sizeof buf)
      return 0;
    if (r > 0 || (r < 0 && errno == EINTR))
      continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return 0;
    return -1;
  }
  return 0;
}

/* Copies n bytes between the ring at index `at` and buf (to_ring: into the
 * ring), wrapping at its end. */
static void ring_copy(axi_shm_ring *r, uint64_t at, void *buf, size_t n,
                      int to_ring) {
  size_t off = (size_t)(at & (r->size - 1)), first = r->size - off;
  if (first > n)
    first = n;
  if (to_ring) {
    memcpy(r->data + off, buf, first);
    memcpy(r->data, (uint8_t *)buf + first, n - first);
  } else {
    memcpy(buf, r->data + off, first);
    memcpy((uint8_t *)buf + first, r->data, n - first);
  }
}

/* Bytes the writer may still put in (-1: the reader's index is off). */
static int64_t ring_space(axi_shm_ring *r) {
  uint64_t used =
      r->mine - atomic_load_explicit(&r->h->tail, memory_order_acquire);
  return used > r->size ? -1 : (int64_t)(r->size - used);
}

/* Bytes the reader may take (-1: the writer's index is off). */
static int64_t ring_avail(axi_shm_ring *r) {
  uint64_t a =
      atomic_load_explicit(&r->h->head, memory_order_acquire) - r->mine;
  return a > r->size ? -1 : (int64_t)a;
}

/* Publishes our index; rings the other side's bell if it sleeps. */
static void ring_publish(axi_shm_ring *r, int fd, int writer) {
  atomic_store_explicit(writer ? &r->h->head : &r->h->tail, r->mine,
                        memory_order_release);
  atomic_thread_fence(memory_order_seq_cst);
  _Atomic uint32_t *sleeping =
      writer ? &r->h->reader_sleeping : &r->h->writer_sleeping;
  if (atomic_load_explicit(sleeping, memory_order_relaxed) &&
      atomic_exchange(sleeping, 0))
    ring_bell(fd);
}

/* Marks our side asleep, then looks again: the other side either sees the
 * flag (and rings) or had already published what we look at now. */
static int64_t ring_sleep(axi_shm_ring *r, int writer) {
  _Atomic uint32_t *mine =
      writer ? &r->h->writer_sleeping : &r->h->reader_sleeping;
  atomic_store(mine, 1);
  atomic_thread_fence(memory_order_seq_cst);
  int64_t k = writer ? ring_space(r) : ring_avail(r);
  if (k != 0)
    atomic_store(mine, 0);
  return k;
}

ssize_t axi_shm_read(bconn *c, void *dst, size_t n) {
  axi_shm_ring *r = c->ring;
  size_t got = 0;
  while (got < n) {
    int64_t a = ring_avail(r);
    if (a == 0 && (a = ring_sleep(r, 0)) == 0)
      break; /* asleep: the writer's next bytes ring the bell */
    if (a < 0) {
      if (axi_refusal_logged(c->b->node))
        fprintf(stderr, "axon: %s: shared-memory ring from %s is corrupt\n",
                c->b->node->name, c->peer ? AXI_PNAME(c->peer) : "a stranger");
      return -1;
    }
    size_t k = n - got < (size_t)a ? n - got : (size_t)a;
    k = k < SHM_CHUNK ? k : SHM_CHUNK;
    ring_copy(r, r->mine, (uint8_t *)dst + got, k, 0);
    r->mine += k;
    got += k;
    ring_publish(r, c->fd, 0);
  }
  return (ssize_t)got;
}

/* Puts what fits of iov in the ring: the bytes taken, 0 when it is full
 * (the reader's bell wakes the I/O thread), -1 when the ring is corrupt.
 * The index is published once per chunk and once at the end, not per
 * segment: a small frame's segments reach a sleeping reader with one bell
 * and wake it once. */
static ssize_t ring_writev(axi_shm_ring *r, int fd, const struct iovec *iov,
                           int n) {
  size_t put = 0, unpublished = 0;
  for (int i = 0; i < n; i++) {
    size_t off = 0;
    while (off < iov[i].iov_len) {
      int64_t s = ring_space(r);
      if (s == 0) {
        if (unpublished) { /* the reader must see them to make room */
          ring_publish(r, fd, 1);
          unpublished = 0;
        }
        if ((s = ring_sleep(r, 1)) == 0)
          return (ssize_t)put;
      }
      if (s < 0)
        return -1;
      size_t k =
          iov[i].iov_len - off < (size_t)s ? iov[i].iov_len - off : (size_t)s;
      k = k < SHM_CHUNK ? k : SHM_CHUNK;
      ring_copy(r, r->mine, (uint8_t *)iov[i].iov_base + off, k, 1);
      r->mine += k;
      off += k;
      put += k;
      unpublished += k;
      if (unpublished >= SHM_CHUNK) {
        ring_publish(r, fd, 1);
        unpublished = 0;
      }
    }
  }
  if (unpublished)
    ring_publish(r, fd, 1);
  return (ssize_t)put;
}

ssize_t axi_shm_writev(bconn *c, const struct iovec *iov, int n) {
  return ring_writev(c->ring, c->fd, iov, n);
}

int axi_shm_put(axi_shm_ring *r, int fd, const void *buf, size_t len) {
  struct iovec iov = {(void *)buf, len};
  return ring_writev(r, fd, &iov, 1) == (ssize_t)len
             ? AX_OK
             : ax_seterr(AX_EPEERDOWN, "shm: the ring did not take the hello");
}

/* ---- dialling -----------------------------------------------------------*/
int axi_shm_dial(const char *hostport, int *out) {
  struct sockaddr_un sa;
  socklen_t len;
  AX_TRY(axi_shm_listen_addr(hostport, &sa, &len));
  /* Non-blocking: a Unix connect to a full backlog (a stopped or stuck
   * peer) fails with EAGAIN at once instead of holding the dialler. */
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return ax_seterr(AX_EIO, "shm: socket: %s", strerror(errno));
  int r;
  do
    r = connect(fd, (struct sockaddr *)&sa, len);
  while (r < 0 && errno == EINTR);
  if (r < 0) {
    int e = errno;
    close(fd);
    return ax_seterr(AX_EPEERDOWN, "shm: connect %s: %s", hostport,
                     strerror(e));
  }
  *out = fd;
  return AX_OK;
}
