"""Sites and their files: segment files, atomic writes, verified copies, work-directory paths."""
