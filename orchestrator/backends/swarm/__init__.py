"""backends/swarm"""
