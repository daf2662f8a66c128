"""The gym ids of searchgym's envs, as constants the rooms that name an env import (world, integrations, envs).

Only the names live here, on envs' floor: registering them (`searchgym.registration`) names factories on higher
floors (world's SyntheticQA, agents' SimulatedQA) by entry-point string, so it sits above them."""

LOCAL_QA = "searchgym/LocalQA-v0"
SYNTHETIC_QA = "searchgym/SyntheticQA-v0"
WEB_QA = "searchgym/WebQA-v0"
SIMULATED_QA = "searchgym/SimulatedQA-v0"
