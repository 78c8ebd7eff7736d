"""Shared fakes, models and helpers of the test suite; test modules import from here, never from each other."""
