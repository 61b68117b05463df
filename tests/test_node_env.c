/* ax_node_opts_from_env (rpc/node.h): the master from AXON_MASTER_ADDR and
 * AXON_MASTER_PORT, the rank from SLURM_PROCID or OMPI_COMM_WORLD_RANK, as
 * srun and mpirun set them; bad values are AX_EINVAL and change nothing. */
#include <stdlib.h>
#include <string.h>

#include "axon/rpc/node.h"
#include "harness.h"

static const char *const vars[] = {"AXON_MASTER_ADDR", "AXON_MASTER_PORT",
                                   "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"};

static int clear_env(void **state) {
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
    unsetenv(vars[i]);
  return 0;
}

static void test_nothing_set(void **state) {
  ax_node_opts o;
  ax_node_opts_init(&o);
  AX_ASSERT_OK(ax_node_opts_from_env(&o));
  assert_null(o.master);
  assert_int_equal(o.rank, -1);
}

static void test_master_addr_and_port(void **state) {
  setenv("AXON_MASTER_ADDR", "10.0.0.1", 1);
  setenv("AXON_MASTER_PORT", "29600", 1);
  ax_node_opts o;
  ax_node_opts_init(&o);
  AX_ASSERT_OK(ax_node_opts_from_env(&o));
  assert_string_equal(o.master, "10.0.0.1:29600");
  assert_int_equal(o.rank, -1);
}

static void test_master_default_port(void **state) {
  setenv("AXON_MASTER_ADDR", "node-a.cluster", 1);
  ax_node_opts o;
  ax_node_opts_init(&o);
  AX_ASSERT_OK(ax_node_opts_from_env(&o));
  assert_string_equal(o.master, "node-a.cluster:29500");
  setenv("AXON_MASTER_PORT", "", 1); /* empty: the default too */
  ax_node_opts_init(&o);
  AX_ASSERT_OK(ax_node_opts_from_env(&o));
  assert_string_equal(o.master, "node-a.cluster:29500");
}

static void test_port_alone_or_empty_addr(void **state) {
  setenv("AXON_MASTER_PORT", "29600", 1);
  ax_node_opts o;
  ax_node_opts_init(&o);
  AX_ASSERT_OK(ax_node_opts_from_env(&o));
  assert_null(o.master);
  setenv("AXON_MASTER_ADDR", "", 1);
  AX_ASSERT_OK(ax_node_opts_from_env(&o));
  assert_null(o.master);
}

static void test_rank_from_slurm(void **state) {
  setenv("SLURM_PROCID", "3", 1);
  ax_node_opts o;
  ax_node_opts_init(&o);
  AX_ASSERT_OK(ax_node_opts_from_env(&o));
  assert_int_equal(o.rank, 3);
  assert_null(o.master);
}

static void test_rank_from_ompi(void **state) {
  setenv("OMPI_COMM_WORLD_RANK", "5", 1);
  ax_node_opts o;
  ax_node_opts_init(&o);
  AX_ASSERT_OK(ax_node_opts_from_env(&o));
  assert_int_equal(o.rank, 5);
  setenv("SLURM_PROCID", "", 1); /* empty: Open MPI's still counts */
  ax_node_opts_init(&o);
  AX_ASSERT_OK(ax_node_opts_from_env(&o));
  assert_int_equal(o.rank, 5);
}

static void test_slurm_wins_over_ompi(void **state) {
  setenv("SLURM_PROCID", "0", 1);
  setenv("OMPI_COMM_WORLD_RANK", "7", 1);
  ax_node_opts o;
  ax_node_opts_init(&o);
  AX_ASSERT_OK(ax_node_opts_from_env(&o));
  assert_int_equal(o.rank, 0);
}

static void test_explicit_rank_kept(void **state) {
  setenv("SLURM_PROCID", "3", 1);
  ax_node_opts o;
  ax_node_opts_init(&o);
  o.rank = 1; /* --rank given: the environment does not override it */
  AX_ASSERT_OK(ax_node_opts_from_env(&o));
  assert_int_equal(o.rank, 1);
  /* Nor is an explicit rank's validity affected by a bad variable. */
  setenv("SLURM_PROCID", "x", 1);
  AX_ASSERT_OK(ax_node_opts_from_env(&o));
  assert_int_equal(o.rank, 1);
}

/* A bad value is AX_EINVAL naming the variable, and o is unchanged. */
static void expect_bad(const char *var, const char *value) {
  setenv("AXON_MASTER_ADDR", "10.0.0.9", 1);
  setenv(var, value, 1);
  ax_node_opts o;
  ax_node_opts_init(&o);
  const char *before = "keep:1";
  o.master = before;
  AX_ASSERT_ERR(ax_node_opts_from_env(&o), AX_EINVAL);
  if (!strstr(ax_errmsg(), var))
    fail_msg("%s='%s': message does not name the variable: %s", var, value,
             ax_errmsg());
  assert_ptr_equal(o.master, before);
  assert_int_equal(o.rank, -1);
  unsetenv(var);
}

static void test_bad_values_rejected(void **state) {
  expect_bad("SLURM_PROCID", "abc");
  expect_bad("SLURM_PROCID", "2x");
  expect_bad("SLURM_PROCID", "-1");
  expect_bad("SLURM_PROCID", "65536");
  expect_bad("SLURM_PROCID", "99999999999999999999");
  expect_bad("OMPI_COMM_WORLD_RANK", " ");
  expect_bad("AXON_MASTER_PORT", "http");
  expect_bad("AXON_MASTER_PORT", "0");
  expect_bad("AXON_MASTER_PORT", "65536");
  expect_bad("AXON_MASTER_PORT", "295000");
  /* An address too long for the buffer. */
  char addr[300];
  memset(addr, 'a', sizeof addr - 1);
  addr[sizeof addr - 1] = 0;
  setenv("AXON_MASTER_ADDR", addr, 1);
  ax_node_opts o;
  ax_node_opts_init(&o);
  AX_ASSERT_ERR(ax_node_opts_from_env(&o), AX_EINVAL);
  assert_non_null(strstr(ax_errmsg(), "AXON_MASTER_ADDR"));
  assert_null(o.master);
  AX_ASSERT_ERR(ax_node_opts_from_env(NULL), AX_EINVAL);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test_setup(test_nothing_set, clear_env),
      cmocka_unit_test_setup(test_master_addr_and_port, clear_env),
      cmocka_unit_test_setup(test_master_default_port, clear_env),
      cmocka_unit_test_setup(test_port_alone_or_empty_addr, clear_env),
      cmocka_unit_test_setup(test_rank_from_slurm, clear_env),
      cmocka_unit_test_setup(test_rank_from_ompi, clear_env),
      cmocka_unit_test_setup(test_slurm_wins_over_ompi, clear_env),
      cmocka_unit_test_setup(test_explicit_rank_kept, clear_env),
      cmocka_unit_test_setup(test_bad_values_rejected, clear_env),
  };
  return AX_TEST_MAIN(t);
}
