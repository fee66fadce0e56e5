import Testing

extension Tag {
    /// Suites that Scripts/test.sh runs a second time on PostgreSQL (`LATTICE_TEST_BACKEND=postgres`). The
    /// script finds them by this tag in the source, so renaming a suite keeps its PostgreSQL run; tagging one
    /// adds it.
    @Tag static var postgres: Self
}
