"""Where the run is: Slurm's environment (job id, the job's allocation, requeue), `mode=sbatch`
job scripts, and the results of a multirun. Asked by every later stage; imports none of them."""
