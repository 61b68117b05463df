/* Device maps without a GPU: the --device-map parser (both spellings,
 * errors naming the bad entry), lookups, the check of local destinations
 * (at node creation too), and the frame codec carrying each tensor's
 * device so that the receiver places it through its map.
 *
 * A CUDA tensor cannot exist here, so the codec tests tag a CPU tensor
 * handle with another device while encoding the header only (the encoder
 * reads nothing but the descriptor then), and tell "mapped" from "default"
 * apart by making the default a CUDA device this machine does not have:
 * a tensor that falls back to it fails to decode. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "axon/rpc/codec-impl.h"
#include "axon/rpc/node.h"
#include "harness.h"

static ax_device cuda(int i) { return (ax_device){AX_DEV_CUDA, i}; }

/* A CUDA ordinal absent here (-1 on a machine with every ordinal). */
static int absent_ordinal(void) {
  int n = ax_cuda_device_count();
  return n < AX_MAX_CUDA_DEVICES ? n : -1;
}

static void parse_ok(const char *s, const char *canonical) {
  ax_device_map m;
  char buf[256];
  AX_ASSERT_OK(ax_device_map_parse(s, &m));
  assert_string_equal(ax_device_map_str(&m, buf, sizeof buf), canonical);
}

static void test_parse(void **state) {
  parse_ok("cuda:0=cpu,cpu=cuda:1", "cuda:0=cpu,cpu=cuda:1");
  parse_ok("cuda:0:cpu,cpu:cuda:1", "cuda:0=cpu,cpu=cuda:1"); /* ':' form */
  parse_ok("cuda:cuda:1", "cuda:0=cuda:1"); /* "cuda" is cuda:0 */
  parse_ok("cuda:1:cuda", "cuda:1=cuda:0");
  parse_ok("cuda:15=cuda:2,cuda:2:cuda:15", "cuda:15=cuda:2,cuda:2=cuda:15");
  parse_ok("cpu=cpu", "cpu=cpu");
  parse_ok("", "");
  parse_ok(NULL, "");
  ax_device_map m;
  AX_ASSERT_OK(ax_device_map_parse("cuda:0=cpu,cpu=cuda:1", &m));
  assert_int_equal(m.n, 2);
  char b[16];
  ax_device d = ax_device_map_lookup(&m, cuda(0), cuda(3));
  assert_string_equal(ax_device_str(d, b, sizeof b), "cpu");
  d = ax_device_map_lookup(&m, AX_CPU, cuda(3));
  assert_string_equal(ax_device_str(d, b, sizeof b), "cuda:1");
  d = ax_device_map_lookup(&m, cuda(1), cuda(3)); /* unlisted: default */
  assert_string_equal(ax_device_str(d, b, sizeof b), "cuda:3");
  d = ax_device_map_lookup(NULL, AX_CPU, cuda(2));
  assert_string_equal(ax_device_str(d, b, sizeof b), "cuda:2");
}

static void parse_bad(const char *s, const char *named) {
  ax_device_map m;
  AX_ASSERT_ERR(ax_device_map_parse(s, &m), AX_EINVAL);
  assert_int_equal(m.n, 0);
  if (!strstr(ax_errmsg(), named))
    fail_msg("'%s': message '%s' does not name '%s'", s, ax_errmsg(), named);
}

static void test_parse_errors(void **state) {
  parse_bad("gpu=cpu", "'gpu=cpu'");
  parse_bad("cpu", "'cpu'");
  parse_bad("cpu=", "'cpu='");
  parse_bad("=cpu", "'=cpu'");
  parse_bad("cpu=cuda:0,", "'cpu=cuda:0,'");
  parse_bad(",cpu=cpu", "',cpu=cpu'");
  parse_bad("cpu=cpu,,cuda:0=cpu", "',cuda:0=cpu'");
  parse_bad("cpu=cuda:16", "'cpu=cuda:16'"); /* beyond AX_MAX_CUDA_DEVICES */
  parse_bad("cpu=cuda:x", "'cpu=cuda:x'");
  parse_bad("cpu=cuda:-1", "'cpu=cuda:-1'");
  parse_bad("cpu5=cpu", "'cpu5=cpu'");
  parse_bad("cpu=cpu=cpu", "'cpu=cpu=cpu'");
  parse_bad("cpu = cuda:0", "'cpu = cuda:0'");
  parse_bad("cuda:0=cpu,cpu->cuda:1", "'cpu->cuda:1'");
  parse_bad("cpu=cpu,cpu=cuda:0", "cpu mapped twice");
  parse_bad("cuda:0=cpu,cuda=cpu", "cuda:0 mapped twice");
}

static void test_check_local_devices(void **state) {
  AX_ASSERT_OK(ax_device_check(AX_CPU));
  int gone = absent_ordinal();
  if (gone < 0)
    skip();
  char spec[64], name[24];
  snprintf(name, sizeof name, "cuda:%d", gone);
  AX_ASSERT_ERR(ax_device_check(cuda(gone)), AX_ENODEV);
  assert_non_null(strstr(ax_errmsg(), name));
  ax_device_map m;
  /* sources are the senders' devices: not checked here */
  snprintf(spec, sizeof spec, "%s=cpu", name);
  AX_ASSERT_OK(ax_device_map_parse(spec, &m));
  AX_ASSERT_OK(ax_device_map_check(&m));
  snprintf(spec, sizeof spec, "cuda:0=cpu,cpu=%s", name);
  AX_ASSERT_OK(ax_device_map_parse(spec, &m));
  AX_ASSERT_ERR(ax_device_map_check(&m), AX_ENODEV);
  assert_non_null(strstr(ax_errmsg(), spec + strlen("cuda:0=cpu,")));
  /* a node refuses such a map, and such a device, before serving */
  ax_node_opts o;
  ax_node_opts_init(&o);
  o.name = "mapped";
  o.device_map = m;
  ax_node *n = NULL;
  AX_ASSERT_ERR(ax_node_create(&o, &n), AX_ENODEV);
  assert_null(n);
  assert_non_null(strstr(ax_errmsg(), "node mapped"));
  assert_non_null(strstr(ax_errmsg(), name));
  ax_node_opts_init(&o);
  o.name = "placed";
  o.device = cuda(gone);
  AX_ASSERT_ERR(ax_node_create(&o, &n), AX_ENODEV);
  assert_non_null(strstr(ax_errmsg(), name));
}

/* ---- the codec ----------------------------------------------------------- */

/* The header of a request carrying CPU tensors tagged with devs[i] (the
 * handles are re-tagged only while encoding). Returns the malloc'ed frame
 * (prefix + body, no blob) and fills *x with its prefix. */
static uint8_t *tagged_header(const ax_device *devs, int k, axi_prefix *x) {
  ax_values *v = ax_values_new();
  ax_tensor *t[4];
  for (int i = 0; i < k; i++) {
    int64_t shape[2] = {2, 3 + i};
    t[i] = ax_test_randn((uint64_t)i, 1.0f, 2, shape);
    AX_ASSERT_OK(ax_values_add_tensor(v, t[i]));
    t[i]->device = devs[i];
  }
  axi_msg m = {.kind = AXI_REQUEST, .call_id = 5, .fn = "f", .values = v};
  uint8_t *buf;
  size_t len, blob;
  int rc = axi_frame_encode(&m, 0, 0, &buf, &len, &blob);
  for (int i = 0; i < k; i++) {
    t[i]->device = AX_CPU;
    ax_tensor_release(t[i]);
  }
  ax_values_free(v);
  AX_ASSERT_OK(rc);
  AX_ASSERT_OK(axi_prefix_get(buf, x));
  assert_int_equal(len, AXI_PREFIX_LEN + x->hdr_len);
  return buf;
}

/* Decodes the header with default device dflt and map `spec`. */
static int decode_with(const uint8_t *buf, const axi_prefix *x, ax_device dflt,
                       const char *spec, axi_msg *m) {
  ax_device_map map;
  AX_ASSERT_OK(ax_device_map_parse(spec, &map));
  axi_limits lim = {AXI_MAX_HDR, 65536, 1u << 30};
  return axi_frame_decode_body(x, buf + AXI_PREFIX_LEN, dflt, &map, &lim, 0, m);
}

static void test_codec_carries_devices(void **state) {
  int gone = absent_ordinal();
  if (gone < 0)
    skip();
  ax_device nowhere = cuda(gone); /* falling back to it fails */
  ax_device devs[3] = {cuda(1), AX_CPU, cuda(2)};
  axi_prefix x;
  uint8_t *buf = tagged_header(devs, 3, &x);
  axi_msg m;
  /* every sender device mapped: all land on the CPU */
  AX_ASSERT_OK(
      decode_with(buf, &x, nowhere, "cuda:1=cpu,cpu=cpu,cuda:2=cpu", &m));
  assert_int_equal(ax_values_count(m.values), 3);
  for (int i = 0; i < 3; i++) {
    ax_tensor *t;
    AX_ASSERT_OK(ax_values_get_tensor(m.values, (size_t)i, &t));
    assert_int_equal(t->device.type, AX_DEV_CPU);
    assert_int_equal(t->shape[1], 3 + i);
  }
  axi_msg_clear(&m);
  /* one source left out (each tensor's own tag counts): the default */
  assert_int_not_equal(decode_with(buf, &x, nowhere, "cuda:1=cpu,cpu=cpu", &m),
                       AX_OK);
  assert_null(m.values);
  axi_msg_clear(&m);
  assert_int_not_equal(
      decode_with(buf, &x, nowhere, "cuda:1=cpu,cuda:2=cpu", &m), AX_OK);
  axi_msg_clear(&m);
  free(buf);
  /* the default applies to what is not listed */
  ax_device one[1] = {cuda(3)};
  buf = tagged_header(one, 1, &x);
  AX_ASSERT_OK(decode_with(buf, &x, AX_CPU, "cuda:1=cpu", &m));
  axi_msg_clear(&m);
  assert_int_not_equal(decode_with(buf, &x, nowhere, "cuda:1=cpu", &m), AX_OK);
  axi_msg_clear(&m);
  free(buf);
}

/* A device type this build does not know (a newer sender) is unlisted. */
static void test_codec_unknown_device_type(void **state) {
  int gone = absent_ordinal();
  if (gone < 0)
    skip();
  ax_device odd[1] = {{(ax_device_type)7, 0}};
  axi_prefix x;
  uint8_t *buf = tagged_header(odd, 1, &x);
  axi_msg m;
  AX_ASSERT_OK(decode_with(buf, &x, AX_CPU, "cuda:0=cuda:1", &m));
  axi_msg_clear(&m);
  assert_int_not_equal(decode_with(buf, &x, cuda(gone), "cpu=cpu", &m), AX_OK);
  axi_msg_clear(&m);
  free(buf);
}

/* CPU tensors encode no device fields (proto3 omits zeros): frames of
 * CPU-only programs are byte for byte what senders before the device tag
 * produced, and a frame without them reads as coming from the CPU. */
static void test_codec_cpu_frames_unchanged(void **state) {
  ax_device cpu1[1] = {AX_CPU}, g1[1] = {cuda(1)};
  axi_prefix xc, xg;
  uint8_t *c = tagged_header(cpu1, 1, &xc), *g = tagged_header(g1, 1, &xg);
  assert_int_equal(xg.hdr_len, xc.hdr_len + 4); /* two 2-byte varint fields */
  free(g);
  int gone = absent_ordinal();
  axi_msg m;
  if (gone >= 0) {
    AX_ASSERT_OK(decode_with(c, &xc, cuda(gone), "cpu=cpu", &m));
    axi_msg_clear(&m);
  }
  free(c);
}

/* A whole frame with its blob: the bytes land on the mapped device. */
static void test_codec_roundtrip_mapped(void **state) {
  int64_t shape[2] = {4, 5};
  ax_tensor *t = ax_test_randn(3, 1.0f, 2, shape);
  ax_values *v = ax_values_new();
  AX_ASSERT_OK(ax_values_add_tensor(v, t));
  axi_msg m = {.kind = AXI_RESPONSE, .call_id = 9, .values = v};
  uint8_t *buf;
  size_t len, blob;
  AX_ASSERT_OK(axi_frame_encode(&m, 0, 1, &buf, &len, &blob));
  assert_int_equal(blob, ax_tensor_nbytes(t));
  ax_device_map map;
  AX_ASSERT_OK(ax_device_map_parse("cpu=cpu", &map));
  int gone = absent_ordinal();
  ax_device dflt = gone >= 0 ? cuda(gone) : AX_CPU;
  axi_msg d;
  AX_ASSERT_OK(axi_frame_decode(buf, len, dflt, &map, 1u << 30, &d));
  ax_tensor *u;
  AX_ASSERT_OK(ax_values_get_tensor(d.values, 0, &u));
  assert_int_equal(u->device.type, AX_DEV_CPU);
  assert_memory_equal(ax_f32(u), ax_f32(t), ax_tensor_nbytes(t));
  axi_msg_clear(&d);
  free(buf);
  ax_values_free(v);
  ax_tensor_release(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse),
      cmocka_unit_test(test_parse_errors),
      cmocka_unit_test(test_check_local_devices),
      cmocka_unit_test(test_codec_carries_devices),
      cmocka_unit_test(test_codec_unknown_device_type),
      cmocka_unit_test(test_codec_cpu_frames_unchanged),
      cmocka_unit_test(test_codec_roundtrip_mapped),
  };
  return AX_TEST_MAIN(tests);
}
