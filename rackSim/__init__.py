"""rackSim: discrete-event capacity planning for disaggregated LLM serving."""
