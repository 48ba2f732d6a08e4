"""The rehearsal's drills, one module each.

A drill that acts while the rehearsal's job runs is ``drill(r, job_id) -> Check`` (:mod:`feddg.rehearsal.outcomes`):
it acts, measures what it can at once, and returns the check that judges the job's report once the job has ended.
A drill that runs after the job is ``drill(r, timeout) -> DrillOutcome``: it runs jobs of its own. The command
(:mod:`feddg.rehearsal.command`) maps the names of :mod:`feddg.rehearsal.options` to them.
"""
