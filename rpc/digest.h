/* Message digests for files the runtime writes (checkpoints): SHA-256 from
 * OpenSSL, whose types stay in rpc/digest.c. Thread-safe. */
#ifndef AX_RPC_DIGEST_H
#define AX_RPC_DIGEST_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AX_SHA256_LEN 32

/* out = SHA-256 of buf[0, len). Returns AX_OK, or AX_EIO (with a message)
 * when the digest cannot be computed. buf may be NULL when len is 0. */
int ax_sha256(const void *buf, size_t len, uint8_t out[AX_SHA256_LEN]);
/* The same digest as 64 lowercase hex digits and a NUL in hex. */
int ax_sha256_hex(const void *buf, size_t len, char hex[2 * AX_SHA256_LEN + 1]);

#ifdef __cplusplus
}
#endif
#endif
