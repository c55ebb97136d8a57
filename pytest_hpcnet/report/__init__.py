"""Ways to show a run: terminal tables now; the HTML report and plots build on the same record."""
