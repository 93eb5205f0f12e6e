/* The definition that dlsym(RTLD_NEXT) from next_a must find. */
__attribute__((visibility("default"))) int cs_next_value(void)
{
    return 2;
}

/* Referenced by the test so that the link keeps this library (--as-needed). */
__attribute__((visibility("default"))) int cs_next_b_present(void)
{
    return 1;
}

/* A name starting with "cu", which the shim's dlsym looks at more closely. */
__attribute__((visibility("default"))) int cuNextProbe(void)
{
    return 2;
}
