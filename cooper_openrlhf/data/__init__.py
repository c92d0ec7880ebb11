"""Benchmark loaders (GSM8K, MATH500, SVAMP, OlympiadBench, VerifyBench format) and synthetic arithmetic."""
