"""Test and reliability support, never used by the product itself: kill-and-resume drills on the real CLI, seeded
fault generators and a stand-in chat LLM, shared by the test suite and `searchgym bench reliability`."""
