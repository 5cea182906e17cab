// Shared main for every test binary: prints the rapidcheck parameters (the seed) before any
// test runs, so a failure can always be replayed (RC_PARAMS="seed=..." ./build/tests/<binary>).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  const char* rc = std::getenv("RC_PARAMS");
  std::printf("moecheck tests: RC_PARAMS=\"%s\"\n",
              rc ? rc : "(unset: rapidcheck picks a random seed)");
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
