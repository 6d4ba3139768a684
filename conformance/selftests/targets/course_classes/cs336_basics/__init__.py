"""A stand-in for a student's ``cs336_basics`` package: just the model classes FSDP sees."""
