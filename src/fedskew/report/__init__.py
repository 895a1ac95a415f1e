"""fedskew.report"""
