"""What a search counts, in the order reports show it: one list for the search's and the api's reports."""

STATUSES = ("timed", "estimated", "rejected", "failed", "pruned")  # what became of a Trial
COUNT_KEYS = STATUSES + ("cached",)  # SearchResult.counts: the statuses, and offspring the memo answered

__all__ = ["COUNT_KEYS", "STATUSES"]
