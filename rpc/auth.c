/* Shared-secret authentication (see rpc/auth-impl.h). OpenSSL types stay in
 * this file. */
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "axon/rpc/auth-impl.h"

int axi_auth_load(ax_node *n) {
  const char *path = n->o.token_file;
  if (!path) {
    const char *e = getenv("AXON_TOKEN_FILE");
    path = e && *e ? e : NULL;
  }
  if (!path || !*path)
    return AX_OK; /* no authentication */
  FILE *f = fopen(path, "rb");
  if (!f)
    return ax_seterr(AX_EINVAL, "token file %s: %s", path, strerror(errno));
  uint8_t buf[AXI_TOKEN_MAX + 1];
  size_t len = fread(buf, 1, sizeof buf, f);
  fclose(f);
  while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
    len--;
  if (len < 16 || len > AXI_TOKEN_MAX)
    return ax_seterr(AX_EINVAL,
                     "token file %s: the secret must hold 16 to %d bytes", path,
                     AXI_TOKEN_MAX);
  memcpy(n->token, buf, len);
  n->token_len = len;
  OPENSSL_cleanse(buf, sizeof buf);
  return AX_OK;
}

int axi_refusal_logged(ax_node *n) {
  uint64_t k = __atomic_add_fetch(&n->auth_refused, 1, __ATOMIC_RELAXED);
  return k <= 20 || k % 1000 == 0;
}

int axi_auth_nonce(uint8_t *out) {
  if (RAND_bytes(out, AXI_NONCE_LEN) != 1)
    return ax_seterr(AX_EIO, "auth: no random bytes");
  return AX_OK;
}

void axi_auth_mac(const ax_node *n, const char *label, const uint8_t *nonce,
                  const char *name, const char *addr, const char *bulk,
                  uint64_t inc, uint8_t *out) {
  /* label \0 nonce name \n addr \n bulk \n incarnation \n: each part
   * delimited, so that no two different inputs give the same message. */
  char incs[24];
  snprintf(incs, sizeof incs, "%llu", (unsigned long long)inc);
  const char *parts[4] = {name ? name : "", addr ? addr : "", bulk ? bulk : "",
                          incs};
  size_t ll = strlen(label) + 1, len = ll + AXI_NONCE_LEN;
  for (int i = 0; i < 4; i++)
    len += strlen(parts[i]) + 1;
  uint8_t stack[1024], *msg = len <= sizeof stack ? stack : malloc(len);
  unsigned int ol = AXI_MAC_LEN;
  if (!msg) {
    memset(out, 0, AXI_MAC_LEN); /* fails every check */
    return;
  }
  memcpy(msg, label, ll);
  memcpy(msg + ll, nonce, AXI_NONCE_LEN);
  size_t off = ll + AXI_NONCE_LEN;
  for (int i = 0; i < 4; i++) {
    size_t pl = strlen(parts[i]);
    memcpy(msg + off, parts[i], pl);
    msg[off + pl] = '\n';
    off += pl + 1;
  }
  if (!HMAC(EVP_sha256(), n->token, (int)n->token_len, msg, len, out, &ol))
    memset(out, 0, AXI_MAC_LEN);
  if (msg != stack)
    free(msg);
}

int axi_auth_verify(const ax_node *n, const char *label, const uint8_t *nonce,
                    const char *name, const char *addr, const char *bulk,
                    uint64_t inc, const uint8_t *mac, size_t mac_len) {
  uint8_t want[AXI_MAC_LEN];
  if (mac_len != AXI_MAC_LEN)
    return 0;
  axi_auth_mac(n, label, nonce, name, addr, bulk, inc, want);
  return CRYPTO_memcmp(want, mac, AXI_MAC_LEN) == 0;
}

int axi_hello_member_ok(ax_node *n, const char *name, const char *addr,
                        uint64_t inc, int authenticated, char *why,
                        size_t len) {
  axi_peer *p = axi_peer_find(n, name);
  if (!p)
    return 1;
  pthread_mutex_lock(&p->mu);
  int down = p->state == AXI_PEER_DOWN;
  /* With authentication, a hello under a member's name from another
   * address than the membership's: only a member that is down may come
   * back from new addresses, and then only to rejoin (the master hands out
   * its addresses); nothing is dialled from a hello. */
  int moved = authenticated && addr && *addr && p->addr &&
              strcmp(p->addr, addr) && !down;
  /* Another process than the one the membership names: a stale one (the
   * member restarted), or a newer one this node has not heard of from the
   * master, let in only while the member is down (it is rejoining). */
  int other = p->incarnation && p->incarnation != inc &&
              !(down && inc > p->incarnation);
  pthread_mutex_unlock(&p->mu);
  if (moved)
    snprintf(why, len,
             "a hello under the name of member %.100s from "
             "%.100s, another address, while that member is up",
             name, addr);
  else if (other)
    snprintf(why, len,
             "a hello from another process (incarnation %llu) "
             "under the name of member %.100s, while that member is up or "
             "after it was replaced",
             (unsigned long long)inc, name);
  return !moved && !other;
}
