/*
 * A preempted job saves before it goes (Megatron's --exit-signal-handler and
 * --exit-duration-in-mins; docs/training.md, "Preemption").
 *
 * SIGTERM (Slurm's preemption and time limit, `scancel`, mpirun passing on its own) and SIGINT
 * only set a flag here. At the end of each step the ranks agree whether any rank saw one, or
 * whether the run has passed --exit-duration-in-mins (one small all-reduce, under the job's
 * deadline), so that all stop after the same step, a rank the signal missed too. The run then
 * saves a checkpoint through the usual path (atomic rename, manifest, lock) and ends: exit
 * 128 + the signal's number after a signal (the scheduler sees the job cut short: a requeued
 * job resumes with -y 1), 0 after the duration. The first signal puts the default action back,
 * so a second one ends the process at once: the save's temporary directory is left for the
 * next start to remove, and the checkpoints before it stay as they were.
 */
#ifndef RUN_PREEMPT_H
#define RUN_PREEMPT_H

#ifdef __cplusplus
extern "C" {
#endif

// Handlers for SIGTERM and SIGINT (with SA_RESTART: the run's reads and writes go on).
void preempt_install(void);

// Collective, at a step's end (step: 1-based, for the deadline's message): 0 to go on; else
// the signal that stopped the run (any rank's), or PREEMPT_DURATION when running_ms (rank 0's
// clock since the start) has passed exit_minutes (0: no limit).
#define PREEMPT_DURATION (-1)
int preempt_agree(double running_ms, double exit_minutes, int step);

#ifdef __cplusplus
}
#endif
#endif
