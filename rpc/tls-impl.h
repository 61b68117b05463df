/* Mutual TLS credentials of a node (rpc/tls.c): the CA that signs every
 * member, this node's certificate (subject CN = its name) and key. The
 * control plane hands the PEM texts to gRPC's SSL credentials
 * (grpc_server.c, grpc_stream.c); the data channel uses the OpenSSL
 * context built here (bulk_tls.c). OpenSSL types stay in rpc/. */
#ifndef AX_RPC_TLS_IMPL_H
#define AX_RPC_TLS_IMPL_H

#include "axon/rpc/node-impl.h"

struct x509_st;

/* Longest common name kept (RFC 5280's ub-common-name is 64; names are
 * allowed up to 255 bytes). */
#define AXI_CN_MAX 256

/* Test hook (ax_rpc_debug_tls_any_cn): skip the check that the node's
 * certificate carries its name. */
extern int axi_tls_any_cn;

/* Reads the TLS files of n->o (each NULL field: AXON_TLS_CA, AXON_TLS_CERT,
 * AXON_TLS_KEY) into n and builds the data channel's context. None named:
 * no TLS (AX_OK). AX_EINVAL, with the file named, if only some are named,
 * a file cannot be read or parsed, the key does not match the certificate,
 * the certificate is not signed by the CA, or its CN is not n's name. */
int axi_tls_load(ax_node *n);
/* Frees what axi_tls_load made (NULL-safe fields). */
void axi_tls_free(ax_node *n);
/* AX_EINVAL (with the reason) if n listens on a non-loopback address with
 * neither a token nor TLS and o.insecure is not set. */
int axi_tls_listen_check(ax_node *n);
/* The subject common name of a PEM certificate into buf (len bytes):
 * AX_OK, or AX_EINVAL if it has none or does not parse. */
int axi_tls_pem_cn(const char *pem, char *buf, size_t len);
/* The same for a parsed certificate. */
int axi_tls_x509_cn(struct x509_st *x, char *buf, size_t len);

#endif
