/* SHA-256 (rpc/digest.h) over OpenSSL's one-shot EVP digest. */
#include "axon/rpc/digest.h"

#include <stdio.h>

#include <openssl/evp.h>

#include "axon/kernels/error.h"

int ax_sha256(const void *buf, size_t len, uint8_t out[AX_SHA256_LEN]) {
  unsigned int ol = 0;
  static const uint8_t empty = 0;
  if (!EVP_Digest(buf ? buf : &empty, len, out, &ol, EVP_sha256(), NULL) ||
      ol != AX_SHA256_LEN)
    return ax_seterr(AX_EIO, "SHA-256 of %zu bytes failed", len);
  return AX_OK;
}

int ax_sha256_hex(const void *buf, size_t len,
                  char hex[2 * AX_SHA256_LEN + 1]) {
  uint8_t d[AX_SHA256_LEN];
  AX_TRY(ax_sha256(buf, len, d));
  for (int i = 0; i < AX_SHA256_LEN; i++)
    snprintf(hex + 2 * i, 3, "%02x", d[i]);
  return AX_OK;
}
