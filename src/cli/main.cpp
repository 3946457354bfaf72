// hyserve command line (placeholder until the CLI lands).
#include <cstdio>

int main() {
  std::puts("hyserve");
  return 0;
}
