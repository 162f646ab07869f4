/*
 * A preempted job saves before it goes (Megatron's --exit-signal-handler and
 * --exit-duration-in-mins; docs/training.md, "Preemption").
 *
 * SIGTERM (Slurm's preemption and time limit, `scancel`, mpirun passing on its own) and SIGINT
 * only set a flag here. At the end of each step the ranks agree whether any rank saw one, or
 * whether the run has passed --exit-duration-in-mins (in the step's metrics all-reduce,
 * run/metrics.h: no collective of its own), so that all stop after the same step, a rank the
 * signal missed too. The run then
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

// This rank's request at a step's end: 0 to go on; else the signal it saw, or
// PREEMPT_DURATION when running_ms (its clock since the start) has passed exit_minutes
// (0: no limit). The ranks' largest request is the run's (a signal outranks the duration).
#define PREEMPT_DURATION 1
int preempt_request(double running_ms, double exit_minutes);

#ifdef __cplusplus
}
#endif
#endif
