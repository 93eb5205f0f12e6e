/* A library for LD_PRELOAD in the launcher's tests: launch_prog finds this symbol when it was
 * preloaded, showing that the launcher kept the user's LD_PRELOAD. */
__attribute__((visibility("default"))) int launch_marker = 1;
