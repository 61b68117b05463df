/* Mutual TLS credentials (see rpc/tls-impl.h). OpenSSL types stay in this
 * file and in bulk_tls.c. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/rpc/tls-impl.h"

#define PEM_MAX (1u << 20) /* a CA bundle or a certificate chain */

int axi_tls_any_cn;

/* The text of a PEM file, NUL-terminated, or NULL with the error set. */
static char *read_pem(const char *what, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    ax_seterr(AX_EINVAL, "TLS %s %s: %s", what, path, strerror(errno));
    return NULL;
  }
  char *buf = malloc(PEM_MAX + 1);
  size_t len = buf ? fread(buf, 1, PEM_MAX + 1, f) : 0;
  fclose(f);
  if (!buf || len == 0 || len > PEM_MAX) {
    free(buf);
    ax_seterr(AX_EINVAL, "TLS %s %s: %s", what, path,
              !buf  ? "no memory"
              : len ? "larger than 1 MiB"
                    : "empty");
    return NULL;
  }
  buf[len] = 0;
  return buf;
}

/* OpenSSL's last error as text, for messages. */
static const char *ssl_why(void) {
  static __thread char b[200];
  unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (!e)
    return "not a valid PEM file";
  ERR_error_string_n(e, b, sizeof b);
  return b;
}

int axi_tls_x509_cn(struct x509_st *x, char *buf, size_t len) {
  X509_NAME *sn = x ? X509_get_subject_name(x) : NULL;
  int l =
      sn ? X509_NAME_get_text_by_NID(sn, NID_commonName, buf, (int)len) : -1;
  if (l <= 0 || (size_t)l >= len || strlen(buf) != (size_t)l)
    return ax_seterr(AX_EINVAL, "certificate without a usable common name");
  return AX_OK;
}

int axi_tls_pem_cn(const char *pem, char *buf, size_t len) {
  BIO *b = BIO_new_mem_buf(pem, -1);
  X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
  BIO_free(b);
  int rc = x ? axi_tls_x509_cn(x, buf, len)
             : ax_seterr(AX_EINVAL, "certificate does not parse");
  X509_free(x);
  ERR_clear_error();
  return rc;
}

/* The data channel's context: TLS 1.3 only, both sides present their
 * certificate and verify the other's against the CA. No session tickets
 * (the dialling side never reads after the handshake but for EOF). */
static int make_ctx(ax_node *n, const char *ca, const char *cert,
                    const char *key) {
  SSL_CTX *c = SSL_CTX_new(TLS_method());
  if (!c)
    return ax_seterr(AX_ENOMEM, "TLS: no context: %s", ssl_why());
  n->tls_ctx = c;
  SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION);
  SSL_CTX_set_num_tickets(c, 0);
  SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_mode(c, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  /* Reads take what the socket has (several records per system call)
   * instead of a record header, then its body. */
  SSL_CTX_set_read_ahead(c, 1);
  SSL_CTX_set_default_read_buffer_len(c, 256u << 10);
  /* AES-128-GCM first: the fastest with AES-NI, still 128-bit secure. */
  SSL_CTX_set_ciphersuites(c, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
                              "TLS_CHACHA20_POLY1305_SHA256");
  SSL_CTX_set_verify(c, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                     NULL);
  if (SSL_CTX_load_verify_locations(c, ca, NULL) != 1)
    return ax_seterr(AX_EINVAL, "TLS CA %s: %s", ca, ssl_why());
  if (SSL_CTX_use_certificate_chain_file(c, cert) != 1)
    return ax_seterr(AX_EINVAL, "TLS certificate %s: %s", cert, ssl_why());
  if (SSL_CTX_use_PrivateKey_file(c, key, SSL_FILETYPE_PEM) != 1)
    return ax_seterr(AX_EINVAL, "TLS key %s: %s", key, ssl_why());
  if (SSL_CTX_check_private_key(c) != 1)
    return ax_seterr(AX_EINVAL, "TLS key %s does not match certificate %s", key,
                     cert);
  /* The node's own certificate must verify against the CA its peers use. */
  X509 *x = SSL_CTX_get0_certificate(c);
  X509_STORE_CTX *v = X509_STORE_CTX_new();
  int ok = v && X509_STORE_CTX_init(v, SSL_CTX_get_cert_store(c), x, NULL) &&
           X509_verify_cert(v) == 1;
  int err = v ? X509_STORE_CTX_get_error(v) : 0;
  X509_STORE_CTX_free(v);
  ERR_clear_error();
  if (!ok)
    return ax_seterr(AX_EINVAL,
                     "TLS certificate %s does not verify against "
                     "CA %s: %s",
                     cert, ca, X509_verify_cert_error_string(err));
  char cn[AXI_CN_MAX] = "";
  if (axi_tls_x509_cn(x, cn, sizeof cn) != AX_OK ||
      (strcmp(cn, n->name) &&
       !__atomic_load_n(&axi_tls_any_cn, __ATOMIC_RELAXED)))
    return ax_seterr(AX_EINVAL,
                     "TLS certificate %s is for '%s', not for "
                     "this node '%s' (its CN must be the node's name)",
                     cert, cn, n->name);
  return AX_OK;
}

int axi_tls_load(ax_node *n) {
  const char *f[3] = {n->o.tls_ca, n->o.tls_cert, n->o.tls_key};
  static const char *env[3] = {"AXON_TLS_CA", "AXON_TLS_CERT", "AXON_TLS_KEY"};
  static const char *what[3] = {"CA", "certificate", "key"};
  int named = 0;
  for (int i = 0; i < 3; i++) {
    if (!f[i]) {
      const char *e = getenv(env[i]);
      f[i] = e && *e ? e : NULL;
    }
    if (f[i] && !*f[i])
      f[i] = NULL;
    named += f[i] != NULL;
  }
  if (named == 0)
    return AX_OK;
  if (named != 3)
    return ax_seterr(AX_EINVAL,
                     "TLS needs all three of --tls-ca, --tls-cert "
                     "and --tls-key (or AXON_TLS_CA/CERT/KEY); %s is missing",
                     !f[0]   ? "the CA"
                     : !f[1] ? "the certificate"
                             : "the key");
  char **pem[3] = {&n->tls_ca_pem, &n->tls_cert_pem, &n->tls_key_pem};
  for (int i = 0; i < 3; i++)
    if (!(*pem[i] = read_pem(what[i], f[i])))
      return AX_EINVAL;
  AX_TRY(make_ctx(n, f[0], f[1], f[2]));
  n->tls = 1;
  return AX_OK;
}

void axi_tls_free(ax_node *n) {
  SSL_CTX_free(n->tls_ctx);
  n->tls_ctx = NULL;
  free(n->tls_ca_pem);
  free(n->tls_cert_pem);
  if (n->tls_key_pem) {
    OPENSSL_cleanse(n->tls_key_pem, strlen(n->tls_key_pem));
    free(n->tls_key_pem);
  }
  n->tls_ca_pem = n->tls_cert_pem = n->tls_key_pem = NULL;
  n->tls = 0;
}

/* 1 if the host part of "HOST:PORT" names this machine's loopback. */
static int is_loopback(const char *hostport) {
  char host[256];
  const char *c = strrchr(hostport, ':');
  size_t hl = c ? (size_t)(c - hostport) : strlen(hostport);
  if (hl >= sizeof host)
    return 0;
  memcpy(host, hostport, hl);
  host[hl] = 0;
  char *h = host;
  if (*h == '[' && hl >= 2 && h[hl - 1] == ']') {
    h[hl - 1] = 0;
    h++;
  }
  struct in_addr a4;
  struct in6_addr a6;
  if (inet_pton(AF_INET, h, &a4) == 1)
    return (ntohl(a4.s_addr) >> 24) == 127;
  if (inet_pton(AF_INET6, h, &a6) == 1)
    return IN6_IS_ADDR_LOOPBACK(&a6);
  return !strcmp(h, "localhost");
}

int axi_tls_listen_check(ax_node *n) {
  if (n->tls || n->token_len || n->o.insecure || is_loopback(n->listen))
    return AX_OK;
  return ax_seterr(AX_EINVAL,
                   "node %s: refusing to listen on %s without credentials: "
                   "anyone who reaches it could join and call. Give a token "
                   "(--token-file, AXON_TOKEN_FILE) or TLS (--tls-ca, "
                   "--tls-cert, --tls-key), or --insecure to accept that",
                   n->name, n->listen);
}
