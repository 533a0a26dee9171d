"""scripts/vmtest's host-side tools: the plan (which VM runs which system test, and how long each may
take: koordtest.vmtest.plan, scripts/vmtest-plan), each boot's verdict and the budget table at the end
(koordtest.vmtest.verdict, scripts/vmtest-verdict), and the budgets both read (koordtest.vmtest.budget).
The standard library only: scripts/vmtest runs them with the host's python3, this checkout on PYTHONPATH."""
